"""ASGI entry point for uvicorn: ``uvicorn ingest.main:app``."""

from gristmill.config import load_settings
from ingest.app import create_app

app = create_app(load_settings())
