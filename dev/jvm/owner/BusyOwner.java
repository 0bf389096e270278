/*
 * The busy owner of `python -m dev.workload --scenario hanging --owner-client java`: a real Kafka 4.x Java
 * transactional producer, which runs transaction version 2 (KIP-890 part 2) wherever the cluster finalized
 * transaction.version=2: every EndTxn moves the producer epoch by one, so each transaction writes at its own epoch.
 *
 * Usage: BusyOwner <bootstrap> <transactional.id> <topic> <partition> <busy-topic> <busy-ms> <busy-for-s>
 *
 * Lines on stdout, one step each (dev/workload.py drives it):
 *   READY <offset> <timestamp>  initTransactions, beginTransaction and one record sent to <topic>-<partition> and
 *                               acknowledged: the transaction is open there (the workload reads its producer id and
 *                               epoch from the leader and writes the orphan at that epoch elsewhere, meanwhile)
 *   COMMITTED                   after the line COMMIT on stdin: that transaction committed (any other line, or the
 *                               end of stdin, aborts it instead and exits 3)
 *   BUSY <commits>              then a one-record transaction on <busy-topic> partition 0 every <busy-ms> ms, for
 *                               <busy-for-s> seconds, or until stdin ends (the workload went away): how many committed
 * Then the producer closes and the program exits 0. Logs (Log4j2, warnings) go to stderr.
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class BusyOwner {
    private BusyOwner() {}

    private static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 7) {
            System.err.println(
                    "usage: BusyOwner <bootstrap> <transactional.id> <topic> <partition> <busy-topic> <busy-ms> "
                            + "<busy-for-s>");
            System.exit(2);
        }
        String bootstrap = args[0];
        String transactionalId = args[1];
        String topic = args[2];
        int partition = Integer.parseInt(args[3]);
        String busyTopic = args[4];
        long busyMs = Long.parseLong(args[5]);
        double busyForS = Double.parseDouble(args[6]);

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.CLIENT_ID_CONFIG, "txnwatch-busy-owner-" + transactionalId);
        props.put(ProducerConfig.LINGER_MS_CONFIG, 0);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        int commits = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            RecordMetadata md = producer
                    .send(new ProducerRecord<>(topic, partition, null, "committed".getBytes(StandardCharsets.UTF_8)))
                    .get();
            producer.flush();
            say("READY " + md.offset() + " " + md.timestamp());
            String line = in.readLine();
            if (!"COMMIT".equals(line == null ? null : line.trim())) {
                producer.abortTransaction();
                System.err.println("BusyOwner: got " + line + " instead of COMMIT: aborted");
                System.exit(3);
            }
            producer.commitTransaction();
            say("COMMITTED");

            // The workload holds our stdin open while it waits for us: its end means nobody waits any more.
            AtomicBoolean orphaned = new AtomicBoolean(false);
            Thread watcher = new Thread(() -> {
                try {
                    while (in.readLine() != null) {
                        // nothing else is said to us; read to the end
                    }
                } catch (Exception e) {
                    // a broken pipe ends it too
                }
                orphaned.set(true);
            }, "stdin-watcher");
            watcher.setDaemon(true);
            watcher.start();

            byte[] busy = "busy".getBytes(StandardCharsets.UTF_8);
            long deadline = System.nanoTime() + (long) (busyForS * 1e9);
            while (System.nanoTime() < deadline && !orphaned.get()) {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(busyTopic, 0, null, busy));
                producer.commitTransaction();
                commits++;
                Thread.sleep(busyMs);
            }
            say("BUSY " + commits);
        }
        System.exit(0);
    }
}
