"""ASGI entry point for uvicorn: ``uvicorn ingest.main:app``."""

from core.config import load_settings
from ingest.app import create_app
from ingest.fast_path import InferFastPath
from ingest.tracing import traced

_settings = load_settings()
app = traced(InferFastPath(create_app(_settings), _settings.max_body_bytes), _settings)
