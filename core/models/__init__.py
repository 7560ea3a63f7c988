"""The model contract: what a model takes (its spec), which models exist (the
catalog), and the token ids the API tier makes. Light: no torch, no weights."""
