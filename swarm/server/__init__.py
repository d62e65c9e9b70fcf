"""The swarm server: an OpenAI-compatible endpoint that records episodes and trains on them.

``create_app(settings, backend)`` builds the FastAPI app around a ready backend (tests, tools);
``serve(settings)`` builds the backend from settings and runs uvicorn until stopped.
"""

from swarm.server.app import create_app
from swarm.server.serve import serve
from swarm.server.settings import ServerConfig, ServerSettings

__all__ = ["ServerConfig", "ServerSettings", "create_app", "serve"]
