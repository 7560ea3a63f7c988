"""For operators: the model registry's admin API, the dashboard (decision 33) and the
metrics scrape."""
