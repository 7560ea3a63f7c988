"""The scheduler's decisions, pure: plain classes with the clock passed in, no threads,
no I/O, no Kafka, PostgreSQL or SQLAlchemy (pyproject.toml's import contracts). The
runtime (scheduler/runtime/) calls ``interface.SchedulerInterface`` and reads its
``stats.CoreStats`` snapshot; nothing outside reads the core's fields."""
