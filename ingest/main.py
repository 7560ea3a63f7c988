"""ASGI entry point for uvicorn: ``uvicorn ingest.main:app``."""

from core import redact
from core.config import load_settings
from ingest.app import create_asgi

redact.install()  # uvicorn has configured logging by the time it imports this
app = create_asgi(load_settings())
