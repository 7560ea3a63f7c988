"""Gristmill's own protocol: ``POST /v1/infer`` and ``GET /v1/requests/{id}``."""
