"""The generation engine: continuous batching (scheduler/core/generation/) against a
generation worker process, its tokens and answers into PostgreSQL (decision 32)."""
