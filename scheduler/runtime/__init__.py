"""The scheduler's runtime: threads, worker sockets, Kafka and PostgreSQL around the
pure core (scheduler/core/). Every long-lived thread starts through
``supervisor.Supervisor``; every call into the dispatch core goes through
``host.CoreHost``, the one home of its lock."""
