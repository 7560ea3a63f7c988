"""Continuous batching for generation: the pure policy (``policy.ContinuousBatcher``),
its parts (KV blocks, incremental text with stop strings; its fairness is the
scheduler's one fair queue), and the step loop (``engine.Engine``) that runs it against
any ``StepRunner``, in the tests and in production alike."""
