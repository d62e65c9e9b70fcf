"""The swarm server: an OpenAI-compatible endpoint that records episodes and trains on them.

``create_app(settings, backend)`` builds the FastAPI app around a ready backend (tests, tools);
``serve(settings)`` builds the backend from settings and runs uvicorn until stopped.
"""

from swarm.config import ServerConfig, ServerSettings
from swarm.server.app import create_app
from swarm.server.serve import serve

__all__ = ["ServerConfig", "ServerSettings", "create_app", "serve"]
