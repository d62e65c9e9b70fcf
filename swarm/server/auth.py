"""Bearer tokens: the server's control token and per-episode keys signed with a server secret.

An episode key is ``ep.<episode_id>.<hmac>``: the server can check it without a lookup table, and a
key opens only the episode whose id it carries (a key for episode A used on episode B is a 403).
The control token opens everything. The secret lives in ``<state_dir>/secret`` (mode 0600) so keys
stay valid across a restart of the same server.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from swarm.server.errors import Forbidden, Unauthorized

_KEY_PREFIX = "ep."


@dataclass(frozen=True)
class Principal:
    """Who is calling: the control token holder, or the holder of one episode's key."""

    episode_id: str | None = None

    @property
    def is_control(self) -> bool:
        return self.episode_id is None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def load_or_create_secret(state_dir: Path) -> bytes:
    path = state_dir / "secret"
    if path.exists():
        text = path.read_text().strip()
        if text:
            return bytes.fromhex(text)
    secret = secrets.token_bytes(32)
    write_private(path, secret.hex())
    return secret


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None, state_dir: Path) -> str:
    """The control token: the given one; else on loopback a fresh random one written to
    ``<state_dir>/token`` for the ``swarm`` CLI. Binding elsewhere without a token is refused."""
    if token:
        return token
    if not is_loopback(host):
        raise ValueError(
            f"refusing to bind {host} without a token: pass --token or set SWARM_TOKEN "
            "(only loopback addresses get a generated token)"
        )
    token = secrets.token_urlsafe(24)
    write_private(state_dir / "token", token)
    return token


class KeyRing:
    """Issues and checks bearer credentials."""

    def __init__(self, control_token: str, secret: bytes) -> None:
        self._control = control_token
        self._secret = secret

    def episode_key(self, episode_id: str) -> str:
        return f"{_KEY_PREFIX}{episode_id}.{self._sign(episode_id)}"

    def _sign(self, episode_id: str) -> str:
        return hmac.new(self._secret, episode_id.encode(), hashlib.sha256).hexdigest()[:40]

    def principal(self, request: Request) -> Principal:
        """Authenticate the request's bearer token; 401 when missing or not ours."""
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token or episode key>'")
        if hmac.compare_digest(credential.encode(), self._control.encode()):
            return Principal()
        if credential.startswith(_KEY_PREFIX):
            episode_id, _, signature = credential[len(_KEY_PREFIX):].rpartition(".")
            if episode_id and hmac.compare_digest(signature.encode(), self._sign(episode_id).encode()):
                return Principal(episode_id=episode_id)
        raise Unauthorized("invalid token or episode key")

    def control(self, request: Request) -> Principal:
        principal = self.principal(request)
        if not principal.is_control:
            raise Forbidden("this route needs the server's control token, not an episode key")
        return principal

    def for_episode(self, request: Request, episode_id: str) -> Principal:
        """The control token, or the key of exactly this episode."""
        principal = self.principal(request)
        if not principal.is_control and principal.episode_id != episode_id:
            raise Forbidden(f"this episode key does not open episode {episode_id}")
        return principal


# FastAPI dependencies. As dependencies they run before the request body is validated, so a caller
# without the right credential learns nothing about the body a route expects (a 401/403, not a 422).


def require_control(request: Request) -> Principal:
    """Dependency: the control token (an episode key is a 403, anything else a 401)."""
    return _keys(request).control(request)


def require_episode(request: Request, episode_id: str) -> Principal:
    """Dependency: the control token or the key of the episode named in the path."""
    return _keys(request).for_episode(request, episode_id)


def _keys(request: Request) -> KeyRing:
    keys: KeyRing = request.app.state.ctx.keys
    return keys
