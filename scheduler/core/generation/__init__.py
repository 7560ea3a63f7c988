"""Continuous batching for generation: the pure policy (``policy.ContinuousBatcher``),
its parts (KV blocks, token-cost fairness, incremental text with stop strings), and a
step loop (``engine.Engine``) that runs it against any ``StepRunner``."""
