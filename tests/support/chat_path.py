"""How many ``swarm`` modules one non-streaming chat completion passes through (issue #51).

Starts the real app (``create_app``) on the tiny torch model with no worker pool, in this process,
with uvicorn on a loopback thread, claims an episode, sends one warm-up chat call (so lazy imports
and first-call caches are out of the way), then profiles a second identical call: every thread's
profile hook (``threading.setprofile`` before any server thread starts, ``sys.setprofile`` here)
notes the ``__name__`` of each module whose Python function is entered while the request is in
flight. The measuring thread (the HTTP client) is left out, so what is counted is what the server
runs between the request arriving and its tokens being recorded in the episode's trace.

An idle window of the same length, with no request, is profiled too: a module seen there is the
server's background work (the step loop, sweepers), not the chat path, and is listed apart.

Run by hand (tiny model built into a temporary folder, about half a minute on a CPU); it ends with
a ``RESULT chat_path_modules=…`` line, as the benchmarks do (docs/benchmarks.md, "The chat path")::

    PYTHONPATH=. .venv/bin/python tests/support/chat_path.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

if __package__ in (None, ""):  # run as a script: ``support`` lives in tests/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Spell abc."}]


@dataclass
class ChatPath:
    """The ``swarm.*`` modules one chat call ran (``chat``) and those idle background work ran (``idle``)."""

    chat: list[str]
    idle: list[str]

    @property
    def path_only(self) -> list[str]:
        """The modules of the chat call that background work alone does not enter."""
        return [name for name in self.chat if name not in self.idle]


class _Recorder:
    """A profile hook for every thread: collects module names while ``on``, except in ``skip``'s thread."""

    def __init__(self) -> None:
        self.on = False
        self.skip: int | None = None
        self.seen: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call" and threading.get_ident() != self.skip:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("swarm."):
                self.seen.add(name)

    def window(self, action: Callable[[], None]) -> list[str]:
        self.seen = set()
        self.skip = threading.get_ident()
        self.on = True
        try:
            action()
        finally:
            self.on = False
        return sorted(self.seen)


def measure(model_dir: Path, state_dir: Path) -> ChatPath:
    """Serve ``model_dir`` (a Hugging Face folder) from ``state_dir`` and profile one chat call."""
    recorder = _Recorder()
    threading.setprofile(recorder)  # before the backend and uvicorn start their threads
    sys.setprofile(recorder)
    try:
        return _measure(recorder, model_dir, state_dir)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]  # None clears the hook, as documented
        sys.setprofile(None)


def _measure(recorder: _Recorder, model_dir: Path, state_dir: Path) -> ChatPath:
    import httpx
    import uvicorn

    from support import free_port, wait_for
    from swarm.backends import load_backend
    from swarm.server import ServerConfig, ServerSettings, create_app

    config = ServerConfig().patched({"group_size": 1, "min_group_size": 1, "batch_groups": 1000, "max_tokens": 24})
    settings = ServerSettings(model=str(model_dir), host="127.0.0.1", port=free_port(), state_dir=state_dir,
                              token="chat-path", config=config)
    app = create_app(settings, load_backend(settings.model, settings.config, seed=0))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="chat-path-uvicorn", daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 60, what="the server to start", interval=0.02)
        url = f"http://127.0.0.1:{settings.port}"
        with httpx.Client(base_url=url, timeout=120, headers={"Authorization": "Bearer chat-path"}) as control:
            episode = control.post("/api/v1/episodes", json={"task_id": "t"}).json()
        with httpx.Client(base_url=episode["base_url"], timeout=120,
                          headers={"Authorization": f"Bearer {episode['api_key']}"}) as llm:
            def chat() -> None:
                response = llm.post("/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                               "max_tokens": 8, "seed": 1})
                response.raise_for_status()

            chat()  # warm-up: imports and caches
            started = time.perf_counter()
            chat_modules = recorder.window(chat)
            took = time.perf_counter() - started
        idle_modules = recorder.window(lambda: time.sleep(took))
        return ChatPath(chat=chat_modules, idle=idle_modules)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def main() -> None:
    """Build the tiny model, measure, and print the count and the modules."""
    from swarm.models.tiny import build_tiny

    with tempfile.TemporaryDirectory(prefix="chat-path-") as tmp:
        model = build_tiny(Path(tmp) / "model", seed=0)
        path = measure(model, Path(tmp) / "state")
    print(f"{len(path.chat)} swarm modules on one non-streaming chat completion:")
    for name in path.chat:
        print(f"  {name}{'  (also idle)' if name in path.idle else ''}")
    print(f"{len(path.path_only)} of them not entered by background work alone; idle window: {len(path.idle)}")
    print(f"RESULT chat_path_modules={len(path.chat)} chat_path_only={len(path.path_only)}")


if __name__ == "__main__":
    main()
