"""PostgreSQL access: result store and request log, batches, tenants and keys,
the live model registry, idempotency records, and result notification."""
