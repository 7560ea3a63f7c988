"""Benchmarks: open-loop load generators and the charts they draw."""
