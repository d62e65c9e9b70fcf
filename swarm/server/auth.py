"""Bearer credentials: control, client and worker tokens, and episode and run keys signed with a secret.

Five credentials, from most to least powerful:

- the **control token** opens everything (config, control, SFT, events, metrics, and all below);
- the **client token** is what study code and ``swarm run`` hold: it claims episodes, heartbeats,
  finishes and aborts them, looks them up, and reads ``GET /api/v1/status`` (a study's ``setup``
  checks the policy version there). Anything else is a 403 that names the control token, so a
  machine running clients cannot PATCH config, run SFT or stop the server;
- the **worker token** is what ``swarm worker`` processes hold: it opens only the pool's routes (join,
  heartbeat, leave under ``/api/v1/workers`` and the relay's reads under ``/pool/v1``); the server
  calls its workers, and workers call each other, with the same token;
- an **episode key** ``ep.<episode_id>.<hmac>`` opens only the episode whose id it carries (chat
  completions recorded into it, heartbeat, finish, abort): the server checks it without a lookup table;
- a **run key** ``run.<name>.<hmac>`` (``POST /api/v1/runs``) is one credential for a whole run: each
  conversation it sends is an episode of its own (``swarm.server.episodes.runs``), and it opens only those.

Everything a restart must keep lives in the state dir, readable by the owner only (0600): ``secret``
(so episode and run keys stay valid), ``token``, ``client_token`` and ``worker_token`` (so clients
started before a crash carry on after it). A token given to the server (``SWARM_TOKEN`` /
``SWARM_CLIENT_TOKEN`` / ``SWARM_WORKER_TOKEN``) wins over the file and is not written; tools should
hand tokens over by environment or file, never on a command line.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from fastapi import Request

from swarm.server.errors import Forbidden, Unauthorized

_KEY_PREFIX = "ep."
_RUN_PREFIX = "run."
_RUN_SIGNED = "\0run:"  # what a run key signs before its name: never an episode id (a header holds no NUL)
TOKEN_FILE = "token"
CLIENT_TOKEN_FILE = "client_token"
WORKER_TOKEN_FILE = "worker_token"


class Role(str, Enum):
    control = "control"
    client = "client"
    worker = "worker"
    episode = "episode"
    run = "run"


_KEY_NAMES = {Role.episode: "an episode key", Role.run: "a run key"}


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's holder (control, client, worker), or one episode's or run's key holder."""

    episode_id: str | None = None
    role: Role = Role.control
    run: str | None = None


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by the owner only (created 0600, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make it 0700: the state dir holds the secret and the tokens."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def _read_private(path: Path) -> str | None:
    """The stripped contents of a credential file (tightened to 0600), or None when absent or empty."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if text:
        os.chmod(path, 0o600)
    return text or None


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
    """The control token: the given one; else the one persisted in ``<state_dir>/token`` (so a
    restarted server keeps it); else, on loopback only, a fresh random one persisted there (0600).
    Binding elsewhere with neither is refused."""
    if token:
        return token
    persisted = _read_private(state_dir / TOKEN_FILE)
    if persisted:
        return persisted
    if not is_loopback(host):
        raise ValueError(
            f"refusing to bind {host} without a token: set SWARM_TOKEN (or pass --token) "
            "(only loopback addresses get a generated token)"
        )
    token = secrets.token_urlsafe(24)
    write_private(state_dir / TOKEN_FILE, token)
    return token


def resolve_client_token(client_token: str | None, state_dir: Path, control_token: str) -> str:
    """The client token: the given one; else the one persisted in ``<state_dir>/client_token``;
    else a fresh random one persisted there (0600) on any host (it opens only episode routes)."""
    return _scoped_token("client", client_token, state_dir / CLIENT_TOKEN_FILE, "SWARM_CLIENT_TOKEN",
                         {"control": control_token})


def resolve_worker_token(worker_token: str | None, state_dir: Path, control_token: str, client_token: str) -> str:
    """The worker token: the given one; else ``<state_dir>/worker_token``; else a fresh random one
    persisted there (0600). It must differ from the control and client tokens."""
    return _scoped_token("worker", worker_token, state_dir / WORKER_TOKEN_FILE, "SWARM_WORKER_TOKEN",
                         {"control": control_token, "client": client_token})


def _scoped_token(name: str, given: str | None, path: Path, env: str, others: dict[str, str]) -> str:
    token = given or _read_private(path)
    if token is None:
        token = secrets.token_urlsafe(24)
        write_private(path, token)
    for other_name, other in others.items():
        if hmac.compare_digest(token.encode(), other.encode()):
            raise ValueError(f"the {name} token must differ from the {other_name} token (check {env} and {path})")
    if token.startswith((_KEY_PREFIX, _RUN_PREFIX)):
        raise ValueError(f"the {name} token must not start with {_KEY_PREFIX!r} or {_RUN_PREFIX!r} (keys do)")
    return token


class KeyRing:
    """Issues and checks bearer credentials."""

    def __init__(self, control_token: str, secret: bytes, client_token: str | None = None,
                 worker_token: str | None = None) -> None:
        self._control = control_token
        self._client = client_token
        self._worker = worker_token
        self._secret = secret

    @property
    def worker_token(self) -> str | None:
        """The token the server calls its pool workers with (they hold the same one)."""
        return self._worker

    def episode_key(self, episode_id: str) -> str:
        return f"{_KEY_PREFIX}{episode_id}.{self._sign(episode_id)}"

    def run_key(self, run: str) -> str:
        """The key of run ``run`` (signed like an episode key, in its own namespace: valid across restarts)."""
        return f"{_RUN_PREFIX}{run}.{self._sign(_RUN_SIGNED + run)}"

    def _sign(self, episode_id: str) -> str:
        return hmac.new(self._secret, episode_id.encode(), hashlib.sha256).hexdigest()[:40]

    def authenticate(self, request: Request) -> Principal:
        """Whichever credential the bearer token is; 401 when missing or not ours."""
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token or episode key>'")
        if hmac.compare_digest(credential.encode(), self._control.encode()):
            return Principal()
        if self._client is not None and hmac.compare_digest(credential.encode(), self._client.encode()):
            return Principal(role=Role.client)
        if self._worker is not None and hmac.compare_digest(credential.encode(), self._worker.encode()):
            return Principal(role=Role.worker)
        if credential.startswith(_KEY_PREFIX):
            episode_id, _, signature = credential[len(_KEY_PREFIX):].rpartition(".")
            if episode_id and hmac.compare_digest(signature.encode(), self._sign(episode_id).encode()):
                return Principal(episode_id=episode_id, role=Role.episode)
        if credential.startswith(_RUN_PREFIX):
            run, _, signature = credential[len(_RUN_PREFIX):].rpartition(".")
            if run and hmac.compare_digest(signature.encode(), self._sign(_RUN_SIGNED + run).encode()):
                return Principal(role=Role.run, run=run)
            raise Unauthorized("invalid run key: this server did not mint it (`swarm key --run NAME` mints one)")
        raise Unauthorized("invalid token or episode key")

    def principal(self, request: Request) -> Principal:
        """The control token, an episode key or a run key (the OpenAI routes: a key's calls are recorded
        into its episode, the control token's are not). The client token is a 403: it generates nothing."""
        principal = self.authenticate(request)
        if principal.role is Role.client:
            raise Forbidden(_client_refused(request, "an episode key (or the control token)"))
        _refuse_worker(principal, request)
        return principal

    def control(self, request: Request) -> Principal:
        principal = self.authenticate(request)
        if principal.role is Role.client:
            raise Forbidden(_client_refused(request, "the control token"))
        _refuse_worker(principal, request)
        if principal.role in (Role.episode, Role.run):
            raise Forbidden(f"this route needs the server's control token, not {_KEY_NAMES[principal.role]}")
        return principal

    def client(self, request: Request) -> Principal:
        """The control token or the client token (claims, status)."""
        principal = self.authenticate(request)
        if principal.role in (Role.episode, Role.run):
            raise Forbidden(f"this route needs the control token or the client token, not {_KEY_NAMES[principal.role]}")
        _refuse_worker(principal, request)
        return principal

    def worker(self, request: Request) -> Principal:
        """The control token or the worker token (the pool's routes)."""
        principal = self.authenticate(request)
        if principal.role not in (Role.control, Role.worker):
            raise Forbidden(f"{request.method} {request.url.path} needs the worker token "
                            "(<state-dir>/worker_token of the server, or $SWARM_WORKER_TOKEN)")
        return principal

    def for_episode(self, request: Request, episode_id: str, run_of: Callable[[str], str | None]) -> Principal:
        """The control or client token, this episode's key, or the key of the run that opened it (``run_of``)."""
        principal = self.authenticate(request)
        _refuse_worker(principal, request)
        if principal.role is Role.episode and principal.episode_id != episode_id:
            raise Forbidden(f"this episode key does not open episode {episode_id}")
        if principal.role is Role.run and run_of(episode_id) != principal.run:
            raise Forbidden(f"the key of run {principal.run!r} does not open episode {episode_id}: "
                            "another run (or a claim) opened it")
        return principal


def _refuse_worker(principal: Principal, request: Request) -> None:
    if principal.role is Role.worker:
        raise Forbidden(f"the worker token cannot {request.method} {request.url.path}; it opens only the pool's "
                        "routes (/api/v1/workers, /pool/v1)")


def _client_refused(request: Request, needed: str) -> str:
    return (f"the client token cannot {request.method} {request.url.path}; use {needed} "
            "(the client token only claims, heartbeats, finishes and aborts episodes and reads status)")


# FastAPI dependencies. As dependencies they run before the request body is validated, so a caller
# without the right credential learns nothing about the body a route expects (a 401/403, not a 422).


def require_control(request: Request) -> Principal:
    """Dependency: the control token (the client token or an episode key is a 403, anything else a 401)."""
    return _keys(request).control(request)


def require_client(request: Request) -> Principal:
    """Dependency: the control token or the client token (an episode key is a 403)."""
    return _keys(request).client(request)


def require_episode(request: Request, episode_id: str) -> str:
    """Dependency: the episode the path names (``swarm.server.episodes.runs.resolve``) once the caller may open it
    (``KeyRing.for_episode``). A 401 comes before any look-up, a 404 before a 403."""
    keys, runs = _keys(request), request.app.state.ctx.runs
    target: str = runs.resolve(episode_id, keys.authenticate(request).run)
    keys.for_episode(request, target, runs.run_of)
    return target


def require_worker(request: Request) -> Principal:
    """Dependency: the control token or the worker token (anything else a 401/403)."""
    return _keys(request).worker(request)


def _keys(request: Request) -> KeyRing:
    keys: KeyRing = request.app.state.ctx.keys
    return keys
