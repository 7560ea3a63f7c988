"""Gristmill: a durable, batching inference front end.

The stages live in their own top-level packages (ingest, scheduler, workers,
results); this package holds only what they share: settings, the message
schema that crosses Kafka, the error tree, topic names and the CLI.
"""

__version__ = "0.1.0"
