"""``python -m gristmill.simulate``: the same as ``gristmill simulate``."""

from gristmill.simulate.cli import main

main()
