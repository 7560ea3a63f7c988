"""The chaos suite: a whole local Gristmill under steady load and random faults,
audited afterwards against what every client was told.

``python -m gristmill.chaos --rounds 20`` runs it; see docs/chaos.md.
"""

from __future__ import annotations
