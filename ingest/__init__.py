"""HTTP API (FastAPI), in rooms (decision 49): the assembly (``app``, ``services``,
``fast_path``, ``main``) over the front doors (``native``, ``openai``, ``kserve``,
``operations``), ``jobs``, ``acceptance`` (the one pipeline every door calls, and the
way back), ``admission``, ``metrics`` and the ``edge`` every route shares."""
