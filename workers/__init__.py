"""Model runtime: the fixed batch API, model loading and warmup, and the worker
process that runs one batch at a time on its device."""
