"""Kafka consumer group member that forms GPU batches and dispatches them.

Two halves (docs/decisions/0047-the-schedulers-core-and-runtime.md):

* ``core/``: every decision, pure. The dispatch core (what each worker runs next, what
  every outcome changes) with its interface and stats snapshot, the batcher, the fair
  queue, the cost curves, offsets, model control, and generation's continuous-batching
  policy. No thread is started, no clock read, no Kafka, PostgreSQL or SQLAlchemy
  module loaded (an import contract checks it).
* ``runtime/``: what carries the decisions out. The service wiring two engines
  (batching, generation) behind one interface, the consumer lanes, the worker threads,
  the persister, the one lock around the core (``host.CoreHost``), the supervisor every
  long-lived thread starts through, metrics and traces.
"""
