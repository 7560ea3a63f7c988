"""The durability ledger: a read-only consumer group of its own that reconciles what
Kafka accepted against the request log's terminal rows, while the system runs
(decision 54). ``policy.py`` decides, ``reconciler.py`` reads and stores,
``metrics.py`` shows it; the SQL is in results/ledger.py."""
