"""Kafka consumer group member that forms GPU batches and dispatches them.

Pure policy (batcher, flush rule, cost model, offset bookkeeping) lives in
plain classes with no I/O; consumer.py, dispatch.py and persist.py are thin
adapters for Kafka, the worker processes and PostgreSQL; service.py wires them.
"""
