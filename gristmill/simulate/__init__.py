"""A discrete-event simulator of Gristmill's request path, driving the real policy code.

``gristmill simulate`` (gristmill/simulate/cli.py) runs one scenario and prints per
tier what was served, refused and why, latency percentiles and how busy the workers
were; the property tests (tests/unit/simulate/) run it over random model shapes and
traffic mixes; docs/scaling.md uses it to size a deployment.
"""
