"""ASGI entry point for uvicorn: ``uvicorn ingest.main:app``."""

from core import redact
from core.config import load_settings
from core.memory import limit_arenas
from ingest.app import create_asgi

# However the process was started (`gristmill api`, uvicorn itself, the tests): two malloc
# arenas, before any thread of the app allocates (core/memory.py; 15 MiB of growth over
# twelve job uploads without it, 3 MiB with it: bench/steady/upload_memory.py).
limit_arenas()
redact.install()  # uvicorn has configured logging by the time it imports this
app = create_asgi(load_settings())
