"""The API's JSON answer: a Starlette ``JSONResponse`` rendered by orjson.

FastAPI 0.165 deprecated its own ``ORJSONResponse``, and a deprecated class warns on
every instance: the ``warnings`` machinery ran for every answer the API made (a stack
walk and a registry lookup each), and each process's log carried the warning once per
place an answer is made. The rendering is the same as before: non-string keys and
numpy values allowed.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class ORJSONResponse(JSONResponse):
    """JSON rendered by orjson (what FastAPI's deprecated class of this name did)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
