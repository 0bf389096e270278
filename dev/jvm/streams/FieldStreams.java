// A Kafka Streams exactly_once_v2 application for the field-client tests (dev/field_clients.py): what the field
// runs, with its own transactions. A consume-transform-produce with a state store, so every transaction spans the
// repartition topic, the store's changelog, the output topic and a TxnOffsetCommit to __consumer_offsets.
//
//   java -cp '.cache/jars/streams/*:CLASSES' FieldStreams BOOTSTRAP APPLICATION_ID INPUT OUTPUT STATE_DIR INSTANCE
//
// Input values are "<word> <n>"; the word becomes the key (a repartition), a count per word is kept (the store and
// its changelog) and written to OUTPUT. Records keep their input's timestamp (event time, Streams propagates it).
// Prints one line per state change ("STATE RUNNING") and, once running, the stream threads ("THREAD <name>"),
// whose names carry the process id the producers' transactional.id is made of (<application.id>-<process id>-<n>).
// INSTANCE is the consumer's group.instance.id (static membership, as Streams runs on StatefulSets): a restarted
// instance takes its place in the group at once instead of waiting session.timeout.ms for the old member to go.

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Materialized;

public final class FieldStreams {
    public static void main(String[] args) throws InterruptedException {
        if (args.length != 6) {
            System.err.println("usage: FieldStreams BOOTSTRAP APPLICATION_ID INPUT OUTPUT STATE_DIR INSTANCE");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // No record cache: every input record updates the store, so every commit (100 ms under EOS) writes.
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), args[5]);
        // transaction.timeout.ms stays Streams' EOS default (10 s): a pause past it is what the tests make.

        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(args[2])
            .map((key, value) -> KeyValue.pair(value.split(" ", 2)[0], value))
            .groupByKey()
            .count(Materialized.as("counts"))
            .toStream()
            .mapValues(count -> Long.toString(count))
            .to(args[3]);

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            if (now == KafkaStreams.State.RUNNING) {
                for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
                    System.out.println("THREAD " + thread.threadName());
                }
            }
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                done.countDown();
            }
        });
        // A fenced producer is a TaskMigratedException Streams handles itself (rejoin); anything else reaching
        // here replaces the thread, as a production application would configure it.
        streams.setUncaughtExceptionHandler(
            exception -> StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.REPLACE_THREAD);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(20));
            done.countDown();
        }));
        streams.start();
        done.await();
    }
}
