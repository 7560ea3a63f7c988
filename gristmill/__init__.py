"""Gristmill: a durable, batching inference front end.

The shared core lives in ``core``, the stages in their own top-level packages
(ingest, scheduler, workers, results); this package is the top layer above them:
the CLI, local services, the chaos suite, the capacity planner and migrations.
"""

from core import __version__

__all__ = ["__version__"]
