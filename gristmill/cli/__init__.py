"""The ``gristmill`` command."""
