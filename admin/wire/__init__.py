"""Speaking Kafka: the connection, kafka-python under the seams, the seams' types, groups, fetch, versions."""
