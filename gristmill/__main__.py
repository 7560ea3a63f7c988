"""``python -m gristmill`` is the ``gristmill`` command."""

from gristmill.cli.main import app

app(prog_name="gristmill")
