"""What every stage shares: settings, the error tree, the Kafka message and topics,
the scheduler-worker wire types, the vocabulary and the model contract.

It imports no stage (ingest, scheduler, workers, results) and nothing of the top
layer (gristmill); the import contracts in pyproject.toml keep it so.
"""

__version__ = "0.1.0"
