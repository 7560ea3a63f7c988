"""The Python client for Gristmill's HTTP API (``pip install gristmill-client``).

Depends on httpx alone: installing it pulls in no model runtime, Kafka or
PostgreSQL driver.
"""

from gristmill_client.client import FINISHED, AsyncClient, Client, GristmillHTTPError

__all__ = ["FINISHED", "AsyncClient", "Client", "GristmillHTTPError"]
__version__ = "0.1.0"
