"""Speaking Kafka, alone in admin/: clients, errors translated, one module per API family, the seams and their types."""
