"""``researcher start --data``: the user's data file becomes the study's one task (``data``), recorded
with its sha256 in study.toml; the offline planner maps a topic that names no example onto it; the
generated client passes the sandbox's import check. The whole study on the arith data is ``-m study``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from researcher.runs import preflight, sandbox
from researcher.study import datatask, flags
from researcher.types.design import DATA_TASK
from researcher.types.settings import StudyOptions
from swarm import box

ROOT = Path(__file__).resolve().parents[3]
ARITH = ROOT / "studies" / "examples" / "arith"
TOPIC = "Is a learning rate of 1e-3 better than 3e-4 on my data?"


def test_data_task_is_generated_recorded_and_framed(tmp_path: Path) -> None:
    options = StudyOptions(**datatask.options_for(ARITH / "train.parquet", ARITH / "test.parquet", "verl", 100))
    root = datatask.write_task(options, tmp_path / "study", ARITH / "config.toml")
    found = catalog.examples(root)
    assert list(found) == [DATA_TASK]
    source = found["data"].client.read_text()
    assert sandbox.check_client(source) is None
    assert options.data_sha256 == datatask.sha256(ARITH / "train.parquet") and str(ARITH / "train.parquet") in source
    # The written client passes the repository's own lint, a long data path included.
    deep = tmp_path / ("d" * 150) / "train.parquet"
    deep.parent.mkdir()
    deep.write_bytes((ARITH / "train.parquet").read_bytes())
    long = StudyOptions(**datatask.options_for(deep, None, "verl", 100))
    for name, text in (("short.py", source), ("long.py", datatask.client_source(long))):
        (tmp_path / name).write_text(text)
        lint = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", "--config",
                               str(ROOT / "pyproject.toml"), str(tmp_path / name)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout
    assert tomllib.loads(found["data"].config.read_text())["max_tokens"] == 8
    framing = OfflinePlanner(sorted(found)).frame(TOPIC, catalog.describe(root)).value
    assert (framing.task, framing.knob) == ("data", "lr")
    changed = tmp_path / "copy.parquet"
    changed.write_bytes((ARITH / "train.parquet").read_bytes())
    moved = options.model_copy(update={"data": str(changed)})
    datatask.check_unchanged(moved)
    changed.write_bytes(changed.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="changed since the study started"):
        datatask.check_unchanged(moved)


def test_a_reward_file_named_from_the_users_directory_is_recorded_absolute(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs' clients start in their own folders: a relative ``--reward PATH.py:FUNC`` must not reach
    them relative (it failed validation four times, then the study, before this)."""
    monkeypatch.chdir(ROOT)
    gsm = Path("studies/examples/gsm-format")
    options = datatask.options_for(gsm / "train.jsonl", gsm / "test.jsonl", f"{gsm}/reward.py:score", 0)
    assert options["reward"] == f"{ROOT / gsm / 'reward.py'}:score"
    assert datatask.options_for(gsm / "train.jsonl", None, "verl", 0)["reward"] == "verl"
    with pytest.raises(ValueError, match=r"no reward file at studies/none\.py"):
        datatask.options_for(gsm / "train.jsonl", None, "studies/none.py:score", 0)


def test_a_study_on_a_real_model_waits_as_long_as_its_runs_take() -> None:
    real = flags.study_options({"model": "smollm2-135m"}, None)
    assert (real.smoke_timeout_s, real.stall_timeout_s) == (600.0, 900.0)
    for options in (flags.study_options({"model": "tiny"}, None), flags.study_options({}, None)):
        assert (options.smoke_timeout_s, options.stall_timeout_s) == (60.0, 120.0)


def test_a_hub_model_neither_cached_nor_downloadable_stops_the_study_before_it_starts(cli, tmp_path: Path) -> None:
    """Offline (the researcher's environment here), a Hugging Face Hub name outside the hub cache ends
    ``researcher start`` with exit 2 and the download command, before anything of the study is written."""
    cli.env["HF_HUB_CACHE"] = str(tmp_path / "hub")
    done = cli.run("start", "--topic", TOPIC, "--model", "Some/Uncached@v2", "--study-id", "hub", *cli.dirs, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "`hf download Some/Uncached --revision v2 --include" in " ".join(done.stdout.split()), done.stdout
    assert not (cli.studies / "hub").exists()


@pytest.mark.parametrize("model, lr, max_tokens, staleness, micro_batch", [
    # pretrained, 135M parameters: never the tiny example's 1e-3 and 8 tokens, nor a 14 GB micro-batch
    ("smollm2-135m", 1e-5, 96, 4, 2048),
    ("tiny", 1e-3, 9, 1, None),  # byte-level: the longest answer ('#### 16') and 2; TrainConfig's micro-batch
])
def test_a_study_on_a_model_starts_from_defaults_scaled_to_it(model: str, lr: float, max_tokens: int, staleness: int,
                                                             micro_batch: int | None, tmp_path: Path) -> None:
    gsm = ROOT / "studies" / "examples" / "gsm-format"
    options = StudyOptions(**datatask.options_for(gsm / "train.jsonl", gsm / "test.jsonl", "verl", 0), model=model)
    root = datatask.write_task(options, tmp_path / "study", ARITH / "config.toml", scale_to_model=True)
    found = catalog.examples(root)["data"]
    config = tomllib.loads(found.config.read_text())
    assert (config["lr"], config["max_tokens"], config["max_staleness"]) == (lr, max_tokens, staleness)
    assert config.get("micro_batch_tokens") == micro_batch
    assert "EVAL_EVERY = 5" in found.client.read_text()


@pytest.mark.study
def test_researcher_studies_the_users_model_and_data(tmp_path: Path) -> None:
    """Acceptance: a saved model folder as --model, the arith data as --data; the study ends with a
    report about the data task and study.toml holds the data's hash (about 2.5 minutes on 2 cores)."""
    from swarm.models.presets import build_preset

    model = build_preset("tiny", tmp_path / "my-model")
    argv = [sys.executable, "-c", "from researcher.cli import main; main()", "start", "--topic", TOPIC,
            "--data", str(ARITH / "train.parquet"), "--heldout", str(ARITH / "test.parquet"), "--warmup-steps", "100",
            "--model", str(model), "--budget", "8m", "--seeds", "2", "--steps-per-run", "15", "--max-iterations", "1",
            "--study-id", "mydata", "--studies-dir", str(tmp_path / "studies"), "--artifacts-dir", str(tmp_path / "art")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = tomllib.loads((tmp_path / "studies" / "mydata" / "study.toml").read_text())["options"]
    assert study["data_sha256"] == datatask.sha256(ARITH / "train.parquet") and study["model"] == str(model)
    report = (tmp_path / "studies" / "mydata" / "report.md").read_text()
    assert "data task" in report and "lr" in report


def test_a_boxed_data_client_reads_the_users_files_and_nothing_else_outside(tmp_path: Path) -> None:
    """The box shows a client its own folder: a data study passes its data, held-out and reward files in
    (``datatask.readable`` → ``swarm run --box-read``), else its probe finds no data file."""
    assert box.missing() is None, f"no OS sandbox here: {box.missing()} (.ci/setup installs bubblewrap)"
    gsm = ROOT / "studies" / "examples" / "gsm-format"
    options = StudyOptions(**datatask.options_for(gsm / "train.jsonl", gsm / "test.jsonl", f"{gsm}/reward.py:score", 0))
    assert datatask.readable(options) == [gsm / "train.jsonl", gsm / "test.jsonl", gsm / "reward.py"]
    assert datatask.readable(options.model_copy(update={"reward": "verl", "heldout": None})) == [gsm / "train.jsonl"]
    client = catalog.examples(datatask.write_task(options, tmp_path / "study", ARITH / "config.toml"))["data"].client
    swarm = [sys.executable, "-m", "swarm.cli"]
    probe = preflight.run_probe(client, tmp_path / "probe", swarm, read=datatask.readable(options))
    assert isinstance(probe, preflight.ProbeReport), probe
    assert probe.heldout == 32
    blind = preflight.run_probe(client, tmp_path / "blind", swarm)
    assert isinstance(blind, preflight.Failure) and "train.jsonl: no such file" in blind.message, blind
