"""``python -m gristmill.chaos``: see ``gristmill.chaos.cli``."""

from gristmill.chaos.cli import main

raise SystemExit(main())
