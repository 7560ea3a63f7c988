"""Benchmarks of the result store and the request log (issue 19): how many result rows
a scheduler persists per second, and whether the log keeps its speed as it grows."""
