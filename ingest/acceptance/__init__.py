"""Accepting a request: which version answers it (``catalog``, ``routing``), the one
pipeline every front door calls (``pipeline``: admit, claim the Idempotency-Key,
produce with acks=all, wait), and the way back from PostgreSQL (``waiters``,
``streams``)."""
