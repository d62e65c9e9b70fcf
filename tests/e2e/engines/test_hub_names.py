"""Hugging Face Hub names (``--model org/name[@revision]``, ``swarm.models.hub``) against a real hub
cache laid out offline (``support.hub_cache``) that holds the converted SmolLM2 folder as
HuggingFaceTB/SmolLM2-135M-Instruct at two commits: a name and a name@revision resolve to their
snapshot (also through ``HF_HUB_CACHE``), an uncached name names its download command, a local
folder shaped like a name stays a folder, and ``swarm serve`` either answers from the snapshot (slow:
it loads SmolLM2) or exits 2 before anything is served. Offline (tests/conftest.py sets
``HF_HUB_OFFLINE=1``), but for one test of the online path against a stand-in Hub on loopback
(``support.fake_hub``): only what engines read is downloaded, and found again offline."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support import ROOT, SWARM, ServeProcess, free_port
from support.fake_hub import FakeHub, serve_hub
from support.hub_cache import add_snapshot, fake_commit

from swarm.models.hub import HubModelMissing, HubName, parse_hub_name
from swarm.models.resolve import model_name, resolve_model_folder

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAIN, TAGGED = fake_commit("main"), fake_commit("v1")  # refs/main and refs/v1 name different commits
QUESTION = "What is 7 + 5? Answer with a number only."


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = resolve_model_folder("smollm2-135m")  # converted once into the session's model cache
    cache = tmp_path_factory.mktemp("hub").resolve()
    add_snapshot(cache, REPO, source, MAIN, refs=("main",))
    add_snapshot(cache, REPO, source, TAGGED, refs=("v1",))
    return cache


def _snapshot(cache: Path, commit: str) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit


def _offline(cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def test_the_cache_is_one_huggingface_hub_reads(hub_cache: Path) -> None:
    from huggingface_hub import scan_cache_dir

    scanned = scan_cache_dir(hub_cache)
    assert not scanned.warnings, scanned.warnings
    (repo,) = scanned.repos
    assert repo.repo_id == REPO
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {MAIN: {"main"}, TAGGED: {"v1"}}


def test_a_name_and_a_revision_resolve_to_their_snapshot(hub_cache: Path) -> None:
    cases = {REPO: MAIN, f"{REPO}@main": MAIN, f"{REPO}@v1": TAGGED, f"{REPO}@{TAGGED}": TAGGED}
    for name, commit in cases.items():
        assert resolve_model_folder(name, hub_cache=hub_cache) == _snapshot(hub_cache, commit), name
        assert model_name(name, _snapshot(hub_cache, commit)) == REPO  # as vLLM names it: no revision


def test_the_environment_names_the_hub_cache(hub_cache: Path) -> None:
    """``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` as a user sets them (read by huggingface_hub at import,
    so in a fresh process); the facts defaults scale with come from the cached snapshot."""
    code = ("import json, sys; from swarm.models.resolve import resolve_model_folder;"
            "from swarm.models.named import model_facts; from swarm.defaults import server_defaults;"
            "f = model_facts(sys.argv[1]);"
            "print(json.dumps([str(resolve_model_folder(sys.argv[1] + '@v1')), f.pretrained, f.parameters,"
            " server_defaults(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", code, REPO], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **_offline(hub_cache)})
    assert done.returncode == 0, done.stderr[-2000:]
    folder, pretrained, parameters, defaults = json.loads(done.stdout)
    assert Path(folder) == _snapshot(hub_cache, TAGGED)
    assert (pretrained, parameters) == (True, 134_515_008)  # counted from the safetensors header
    assert defaults == {"lr": 1e-5, "max_tokens": 96, "max_staleness": 4, "micro_batch_tokens": 2048,
                        "eval_hold_s": 300.0}


def _safetensors(values: int) -> bytes:
    """A safetensors file of one float32 tensor of ``values`` zeros."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(4 * values)


def test_online_a_name_downloads_what_engines_read_and_is_found_offline(tmp_path: Path) -> None:
    files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}", "model.safetensors": _safetensors(6),
             "consolidated.safetensors": _safetensors(6), "pytorch_model.bin": b"pickled", "onnx/model.onnx": b"onnx",
             "README.md": b"# a card"}
    hub = FakeHub("Org/Online", fake_commit("online"), files)
    code = ("import sys; from swarm.models.resolve import resolve_model_folder; from swarm.models.named import "
            "model_facts; print(resolve_model_folder(sys.argv[1]), model_facts(sys.argv[1]).parameters)")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path)}
    with serve_hub(hub) as url:
        online = subprocess.run([sys.executable, "-c", code, "Org/Online"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, env={**env, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": url})
    offline = subprocess.run([sys.executable, "-c", code, "Org/Online"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**env, "HF_HUB_OFFLINE": "1"})  # the Hub is gone: the cache serves
    snapshot = tmp_path / "models--Org--Online" / "snapshots" / hub.commit
    for done in (online, offline):
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [str(snapshot), "6"]
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    fetched = {path for method, path in hub.requests if method == "GET" and "/resolve/" in path}
    assert fetched == {f"/Org/Online/resolve/{hub.commit}/{name}" for name in
                       ("config.json", "model.safetensors", "tokenizer.json")}, hub.requests


def test_an_uncached_name_names_its_download_command(tmp_path: Path) -> None:
    with pytest.raises(HubModelMissing) as caught:
        resolve_model_folder("Some/Uncached@v2", hub_cache=tmp_path)
    text = str(caught.value)
    assert "HF_HUB_OFFLINE is set" in text
    assert (f"`hf download Some/Uncached --revision v2 --include '*.json' --include 'model*.safetensors' "
            f"--include '*.txt' --include '*.model' --include '*.tiktoken' --include '*.jinja' --cache-dir {tmp_path}`") in text


def test_a_local_folder_shaped_like_a_name_is_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # names are relative to where swarm runs
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    assert parse_hub_name("org/name") is None
    assert resolve_model_folder("org/name") == Path("org/name")
    assert parse_hub_name("org/other@v1") == HubName("org/other", "v1")
    for path in ("./org/other", "/org/other", "~/org/other", "a/b/c", "org/m.gguf", "org/na--me", "org/", "org/x@"):
        assert parse_hub_name(path) is None, path


def test_serve_and_worker_refuse_an_uncached_name_before_serving(tmp_path: Path) -> None:
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", model="Some/Uncached",
                          env=_offline(tmp_path / "hub"))
    assert server.run_refused(timeout_s=120) == 2, server.log()[-2000:]
    log = " ".join(server.log().split())
    assert "model Some/Uncached is not a local path" in log and "`hf download Some/Uncached --include" in log, log
    assert not (server.state_dir / "buffer.db").exists() and not (server.state_dir / "server.json").exists()
    with httpx.Client() as http, pytest.raises(httpx.ConnectError):
        http.get(f"{server.url}/healthz")  # nothing listened on the port
    worker = subprocess.run([*SWARM, "worker", "--server", "http://127.0.0.1:9", "--model", "Some/Uncached@v2",
                             "--state-dir", str(tmp_path / "w")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, **_offline(tmp_path / "hub"), "SWARM_WORKER_TOKEN": "w"})
    assert worker.returncode == 2, worker.stderr[-2000:]
    assert "`hf download Some/Uncached --revision v2" in " ".join(worker.stderr.split())


@pytest.mark.slow
@pytest.mark.study  # loads SmolLM2 (about a minute, 1.5 GB): run with `pytest -m study`
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_serve_answers_from_a_hub_snapshot(hub_cache: Path, tmp_path: Path, engine: str) -> None:
    """A bare ``swarm serve --model HuggingFaceTB/SmolLM2-135M-Instruct`` (``--engine torch`` or
    ``vllm``: the vLLM child loads the same snapshot folder): the snapshot refs/main names, pinned to
    its commit, greedy arithmetic right, and the defaults scaled to 135M parameters."""
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", model=REPO, env=_offline(hub_cache),
                          extra_args=("--engine", engine))
    server.start(timeout_s=300)
    try:
        assert json.loads((server.state_dir / "server.json").read_text())["model"] == f"{REPO}@{MAIN}"
        with server.http(timeout=300) as http:
            assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [REPO]
            reply = http.post("/v1/chat/completions", json={"model": REPO, "temperature": 0.0, "max_tokens": 12,
                                                            "messages": [{"role": "user", "content": QUESTION}]})
            assert reply.status_code == 200, reply.text
            assert "12" in reply.json()["choices"][0]["message"]["content"]
            assert http.get("/api/v1/config").json()["values"]["lr"] == 1e-5
    finally:
        server.stop()
