"""HTTP API (FastAPI): auth, validation, idempotency, produce to Kafka, wait for results."""
