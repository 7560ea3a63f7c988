"""The KServe Open Inference Protocol v2 (Triton's clients) on the durable path
(decision 34)."""
