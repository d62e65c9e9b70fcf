"""A stand-in for the Hugging Face Hub on loopback: a real HTTP server speaking the part of the Hub's
protocol ``huggingface_hub.snapshot_download`` uses, for one repo at one commit, so the online path
(resolve the revision, list the tree, download each file into the hub cache) runs without a network.
Point huggingface_hub at it with ``HF_ENDPOINT``.

The routes, as huggingface_hub 1.x calls them: ``GET /api/models/{repo}/revision/{revision}`` (the
commit a revision names), ``GET /api/models/{repo}/tree/{commit}`` (every file, with its git blob id
and, for weights, its LFS sha256), and ``HEAD``/``GET /{repo}/resolve/{commit}/{path}`` (a file, with
``X-Repo-Commit`` and its ``ETag``). ``requests`` records every method and path served.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_LFS = (".safetensors", ".bin", ".onnx")  # stored with Git LFS on the Hub: the ETag is the sha256


class FakeHub:
    """One repo (``files``: path to content) at ``commit``, which the branch ``main`` names."""

    def __init__(self, repo_id: str, commit: str, files: dict[str, bytes]) -> None:
        self.repo_id, self.commit, self.files = repo_id, commit, files
        self.requests: list[tuple[str, str]] = []

    def etag(self, path: str) -> str:
        data = self.files[path]
        if path.endswith(_LFS):
            return hashlib.sha256(data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id

    def tree(self) -> list[dict[str, object]]:
        entries: list[dict[str, object]] = []
        for path, data in sorted(self.files.items()):
            entry: dict[str, object] = {"type": "file", "path": path, "size": len(data),
                                        "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}
            if path.endswith(_LFS):
                entry["lfs"] = {"oid": self.etag(path), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


@contextmanager
def serve_hub(hub: FakeHub) -> Iterator[str]:
    """Serve ``hub`` on a free loopback port for the block; its URL (``HF_ENDPOINT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    api = f"/api/models/{hub.repo_id}/"
    resolve = f"/{hub.repo_id}/resolve/"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the test reads ``hub.requests``
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            if path.startswith(api + "revision/"):
                revision = path.removeprefix(api + "revision/")
                if revision not in ("main", hub.commit):
                    return self._send(404, b'{"error": "Revision Not Found"}', {"X-Error-Code": "RevisionNotFound"})
                info = {"id": hub.repo_id, "sha": hub.commit, "siblings": [{"rfilename": p} for p in hub.files]}
                return self._send(200, json.dumps(info).encode(), {})
            if path == api + f"tree/{hub.commit}":
                return self._send(200, json.dumps(hub.tree()).encode(), {})
            if path.startswith(resolve + hub.commit + "/"):
                name = path.removeprefix(resolve + hub.commit + "/")
                if name in hub.files:
                    headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hub.etag(name)}"'}
                    return self._send(200, hub.files[name], headers, body=body)
            self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool = True) -> None:
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
