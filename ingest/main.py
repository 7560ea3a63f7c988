"""ASGI entry point for uvicorn: ``uvicorn ingest.main:app``."""

from core import redact
from core.config import load_settings
from core.memory import limit_arenas
from ingest.app import create_asgi

# However the process was started (`gristmill api`, uvicorn itself as the tests and the
# soak start it): two malloc arenas, before any thread of the app allocates (core/memory.py).
limit_arenas()
redact.install()  # uvicorn has configured logging by the time it imports this
app = create_asgi(load_settings())
