"""Long runs: riding through a slow database, the soak (issue 30)."""
