"""Whether a request may come in now: the tenant's rate, what the live workers can serve
by its deadline (``capacity``, decision 24), a generation's KV cache (``kv``) and this
instance's own saturation (``overload``, decision 15). The decisions are pure, the
clock passed in; ``policy`` turns a refusal into its error and headers."""
