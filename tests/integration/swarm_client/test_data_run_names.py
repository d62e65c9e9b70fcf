"""``swarm run --data`` by dataset folder and name (issue #50), against a real ``swarm serve --model tiny``:
a ``save_to_disk`` folder of gsm8k-shaped rows trains with ``--prompt-key`` / ``--answer-key``; an
``org/name`` laid out in a datasets cache loads offline (``HF_HUB_OFFLINE=1``), held-out split
included; a name neither cached nor reachable exits 2 with the command that fetches it, claiming
nothing. The spec parsing and the ``####`` reduction run in process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ServeProcess, free_port

from swarm.data import DataError, RowKeys, dataset_source, final_answer, read_rows

ROOT = Path(__file__).resolve().parents[3]
ARITH = ROOT / "studies" / "examples" / "arith"
SWARM = [sys.executable, "-m", "swarm.cli"]
KEYS = ["--prompt-key", "question", "--answer-key", "answer"]


def gsm_rows(start: int, count: int) -> list[dict[str, str]]:
    """gsm8k's shape (a question, a worked answer ending ``#### n``) on sums the tiny model can learn."""
    return [{"question": f"What is {i // 10} + {i % 10}?",
             "answer": f"{i // 10} plus {i % 10} makes {i // 10 + i % 10}.\n#### {i // 10 + i % 10}"}
            for i in range(start, start + count)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    proc = ServeProcess(port=free_port(), state_dir=tmp_path_factory.mktemp("serve"), config=ARITH / "config.toml")
    proc.start()
    yield proc
    proc.stop()


def swarm_run(server: ServeProcess, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SWARM, "run", "--server", server.url, "--state-dir", str(server.state_dir), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


def api(server: ServeProcess, path: str) -> object:
    return httpx.get(f"{server.url}/api/v1/{path}", headers={"Authorization": f"Bearer {server.token}"}).json()


def claimed(server: ServeProcess) -> int:
    """Episodes ever claimed (not a sum over states: ``trained`` still grows after the previous test's
    run returns, while the step loop catches up)."""
    status = api(server, "status")
    assert isinstance(status, dict)
    return int(status["episodes"]["claimed"])


def test_specs_are_told_from_paths_and_answers_reduce_to_the_final_number(tmp_path: Path) -> None:
    file = tmp_path / "rows.jsonl"
    file.write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "saved").mkdir()
    assert dataset_source(file) is None
    assert dataset_source(f"{tmp_path}/saved:test") is not None
    name = dataset_source("openai/gsm8k:main:train[:100]")
    assert name is not None and (name.path, name.config, name.split, name.folder) == ("openai/gsm8k", "main",
                                                                                       "train[:100]", False)
    pinned = dataset_source("org/data@v1.0::test")
    assert pinned is not None and (pinned.config, pinned.split, pinned.revision) == (None, "test", "v1.0")
    assert dataset_source("./org/name") is None and dataset_source("no-slash") is None
    with pytest.raises(DataError, match="no such file, folder or dataset name"):
        read_rows(tmp_path / "missing.jsonl")
    assert final_answer("3 + 4 = 7\n#### 1,234 ") == "1234"
    assert final_answer("Paris, France") == "Paris, France" and final_answer(7) == 7
    rows = read_rows(file, RowKeys(answer="answer"))
    assert rows[0].ground_truth == "2" and rows[0].answer == "2"


def test_a_saved_gsm8k_shaped_dataset_trains_three_steps(server: ServeProcess, tmp_path: Path) -> None:
    """Acceptance: ``--data FOLDER --prompt-key question --answer-key answer``, the held-out split
    ``FOLDER:test``, three training steps on the tiny preset."""
    import datasets

    saved = tmp_path / "gsm-like"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(gsm_rows(0, 64)),
                          "test": datasets.Dataset.from_list(gsm_rows(64, 8))}).save_to_disk(str(saved))
    rows = read_rows(saved, RowKeys("question", "answer"))
    assert (rows[0].messages, rows[0].ground_truth) == ([{"role": "user", "content": "What is 0 + 0?"}], "0")
    assert rows[0].answer and rows[0].answer.endswith("#### 0")  # the warm-up's reference: the whole solution

    before = api(server, "status")
    assert isinstance(before, dict)
    done = swarm_run(server, "--data", str(saved), "--heldout", f"{saved}:test", *KEYS, "--reward", "exact",
                     "--episodes", "128", "--eval-every", "2", "--heldout-size", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished=128" in done.stdout
    after = api(server, "status")
    assert isinstance(after, dict) and after["policy_version"] >= before["policy_version"] + 3, after


def _cache_dataset(cache: Path, repo_id: str, config: str, splits: dict[str, list[dict[str, str]]]) -> None:
    """Lay ``splits`` out in the datasets cache ``cache`` as ``load_dataset(repo_id, config)`` leaves a Hub
    dataset of parquet files there: ``<org>___<name>/<config>/<version>/<hash>/`` with its Arrow tables
    and dataset_info.json, built by the Parquet builder the Hub path uses (offline, from local files)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    files = {}
    cache.parent.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        files[split] = [str(cache.parent / f"{split}.parquet")]
        pq.write_table(pa.Table.from_pylist(rows), files[split][0])
    org, name = repo_id.split("/")
    builder = Parquet(cache_dir=str(cache), dataset_name=name, config_name=config, config_id=config,
                      hash="0" * 16, data_files=files)  # a Hub download's hash is its commit's; any fixed one will do
    builder.download_and_prepare()
    (cache / name).rename(cache / f"{org}___{name}")  # the builder was given no repo_id: the Hub's folder name


def test_a_name_in_the_datasets_cache_loads_offline(server: ServeProcess, tmp_path: Path) -> None:
    cache = tmp_path / "hf" / "datasets"
    _cache_dataset(cache, "acme/tinygsm", "main", {"train": gsm_rows(0, 40), "test": gsm_rows(40, 8)})
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache)}
    done = swarm_run(server, "--data", "acme/tinygsm:main", "--heldout", "acme/tinygsm:main:test", *KEYS,
                     "--reward", "exact", "--episodes", "32", "--eval-every", "1", env=offline)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished=32" in done.stdout
    steps = api(server, "metrics")
    assert isinstance(steps, list)
    evals = [s["metrics"]["eval/reward_mean"] for s in steps if "eval/reward_mean" in s["metrics"]]
    assert evals and all(0.0 <= r <= 1.0 for r in evals)


def test_an_uncached_name_exits_2_with_the_fetch_command_and_claims_nothing(server: ServeProcess,
                                                                           tmp_path: Path) -> None:
    before = claimed(server)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "empty")}
    done = swarm_run(server, "--data", "acme/uncached:main", *KEYS, env=offline)
    assert done.returncode == 2, done.stderr[-3000:]
    message = " ".join(done.stderr.split())
    assert "acme/uncached:main: not a local path" in message and "HF_HUB_OFFLINE is set" in message, message
    assert ("`HF_HUB_OFFLINE=0 python -c \"import datasets; datasets.load_dataset('acme/uncached', 'main', "
            "split='train')\"`") in message, message
    assert claimed(server) == before
