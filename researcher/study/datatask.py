"""The user's data task: ``researcher start --data FILE`` studies a data file instead of the examples.

The task becomes one generated example study, ``studies/<id>/task/data/`` (``client.py`` +
``config.toml``), and the study's examples root points there, so everything downstream is unchanged:
the planners frame and plan on task ``data`` with the catalog's knobs, each experiment gets that
client and config, and the pre-training checks (import check, data probe, smoke run with the study's
``setup``) run on it as on any client. The generated client is four lines over ``swarm.data``'s
``build_study``: it reads the file, checks every row and probes the reward when it loads, so a bad
file fails the data probe with its file, row and reason before anything trains.

Why a generated client and not ``swarm run --data`` from the launcher: the launcher, the monitor's
client restarts, the sandbox and the preflight all work on a client file; a generated one keeps them
all meaningful (the probe really reads the data, the smoke run really scores it) with no second path.

A dataset folder or Hugging Face dataset name (``--data openai/gsm8k:main``, see ``swarm.data``) is
loaded once, when the study starts, and its rows (its own columns) are written to a parquet snapshot
in the task folder; the study trains on that file, with ``--prompt-key`` / ``--answer-key`` passed to
every run's client. Why a snapshot and not the name in every run: a run's client is boxed
(``researcher.runs.sandbox.study_env``: HOME is the run folder, no ``HF_*`` variables or tokens), so it
would find no datasets cache, and a Hub dataset could change between runs; one file fixes the rows
the study's runs compare on and keeps ``check_unchanged`` a file hash.

The study records the data in study.toml (``[options]``: ``data``, ``data_sha256``, ``heldout``,
``heldout_sha256``, ``data_name``, ``heldout_name``, ``prompt_key``, ``answer_key``, ``reward``,
``model``); ``check_unchanged`` refuses to resume a study whose data file changed since it started.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from researcher.study.files import dumps_toml
from researcher.types.design import DATA_TASK
from researcher.types.settings import StudyOptions
from swarm.atomic import write_atomic

if TYPE_CHECKING:
    from swarm.data import RowKeys

HELDOUT_FRACTION = 0.1  # without --heldout: this share of the rows, by a stable hash, is never trained
REWARD_RANGE = (-1.0, 1.0)  # verl's rule-based scorers (gsm8k, MATH: 0/1; DAPO: -1/1)
EPOCHS = 1000  # a run stops at its episode budget, not at the end of the file


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def options_for(data: Path | str, heldout: Path | str | None, reward: str, warmup_steps: int, *,
                prompt_key: str = "prompt", answer_key: str | None = None,
                snapshot_dir: Path | None = None) -> dict[str, Any]:
    """The StudyOptions fields of a data task (absolute paths, content hashes); ``ValueError`` on a missing
    file, and ``swarm.data.DataError`` (a ``ValueError``) on a dataset that cannot be loaded, its text the
    command that fetches it. A dataset folder or name is snapshotted into ``snapshot_dir`` first."""
    from swarm.data import RowKeys

    keys = RowKeys(prompt_key, answer_key)
    train, data_name = _data_file("data", data, keys, snapshot_dir)
    held, heldout_name = (None, None) if heldout is None else _data_file("heldout", heldout, keys, snapshot_dir)
    return {"data": str(train.resolve()), "data_sha256": sha256(train),
            "heldout": str(held.resolve()) if held else None,
            "heldout_sha256": sha256(held) if held else None, "reward": _absolute_reward(reward),
            "warmup_steps": warmup_steps, "data_name": data_name, "heldout_name": heldout_name,
            "prompt_key": prompt_key, "answer_key": answer_key}


def _data_file(role: str, spec: Path | str, keys: RowKeys, snapshot_dir: Path | None) -> tuple[Path, str | None]:
    """The file the study trains on for ``spec`` and, when ``spec`` is a dataset folder or name, that name
    (its rows then written to ``snapshot_dir/<role>.parquet``)."""
    from swarm.data import is_dataset, save_snapshot

    if is_dataset(spec):
        if snapshot_dir is None:
            raise ValueError(f"--{role} {spec}: a dataset needs the study's folder for its snapshot")
        return save_snapshot(spec, keys, snapshot_dir / f"{role}.parquet"), str(spec)
    if not Path(spec).is_file():
        raise ValueError(f"no data file at {spec}")
    return Path(spec), None


def _absolute_reward(reward: str) -> str:
    """A ``PATH.py:FUNC`` reward with its file made absolute: the runs' clients start in their own folders,
    where a path relative to the user's directory names nothing. Named rewards (verl, exact, a data
    source) pass through."""
    path, sep, name = reward.rpartition(":")
    if not (sep and path.endswith(".py")):
        return reward
    if not Path(path).is_file():
        raise ValueError(f"no reward file at {path} (--reward {reward})")
    return f"{Path(path).resolve()}:{name}"


def check_unchanged(options: StudyOptions) -> None:
    """``ValueError`` when the study's data files are gone or their content changed since it started."""
    for path, digest in ((options.data, options.data_sha256), (options.heldout, options.heldout_sha256)):
        if path is None:
            continue
        if not Path(path).is_file():
            raise ValueError(f"the study's data file {path} is gone (study.toml records sha256 {digest})")
        if digest and sha256(Path(path)) != digest:
            raise ValueError(f"the study's data file {path} changed since the study started (sha256 {digest} "
                             "in study.toml): restore it, or start a new study on the new data")


def readable(options: StudyOptions) -> list[Path]:
    """The files a data study's boxed clients must read (``swarm run --box-read``): the data, the held-out
    file and a ``PATH.py:FUNC`` reward's file. The box shows a client its own folder and the interpreter
    only, and these live wherever the user keeps them."""
    paths = [options.data, options.heldout, options.reward.rpartition(":")[0] or None]
    return [Path(p) for p in dict.fromkeys(p for p in paths if p) if Path(p).is_file()]


def root(study_dir: Path) -> Path:
    """The examples root of a data study: it holds the one task, ``data``."""
    return study_dir / "task"


def write_task(options: StudyOptions, study_dir: Path, base_config: Path, *, scale_to_model: bool = False) -> Path:
    """Write the data task's client.py and config.toml (the server keys of ``base_config``); its examples root.

    ``scale_to_model`` (a study on ``--model`` without its own ``--data-config``): the learning rate,
    completion length and staleness come from ``swarm.defaults.training_defaults`` for that model and
    the data's longest reference answer, never from the tiny-model example the base config is."""
    folder = root(study_dir) / DATA_TASK
    config = tomllib.loads(base_config.read_text())
    config = dict(config.get("server", config))
    source = f"server keys of the data task (from {base_config})"
    if scale_to_model and options.model:
        config.update(model_defaults(options.model, Path(options.data or ""), options.prompt_key, options.answer_key))
        source += f", scaled to {options.model} (swarm.defaults)"
    write_atomic(folder / "client.py", client_source(options, eval_every=config.pop("eval_every", 5)))
    write_atomic(folder / "config.toml", dumps_toml(config, source))
    origin = f" (a snapshot of the dataset `{options.data_name}`)" if options.data_name else ""
    write_atomic(folder / "README.md", f"# data: {options.data_name or Path(options.data or '').name}\n\nThe user's "
                                       f"data task: {options.data}{origin} (sha256 {options.data_sha256}), reward "
                                       f"`{options.reward}`, "
                                       f"held-out {options.heldout or f'{HELDOUT_FRACTION:g} of the rows by hash'}.\n")
    return root(study_dir)


def model_defaults(model: str, data: Path, prompt_key: str = "prompt", answer_key: str | None = None) -> dict[str, Any]:
    """``training_defaults`` for ``model`` and the longest reference answer in ``data``."""
    from swarm.data import RowKeys, read_rows
    from swarm.defaults import training_defaults

    rows = read_rows(data, RowKeys(prompt_key, answer_key))
    longest = max((len(str(row.answer or row.ground_truth or "")) for row in rows), default=0)
    return training_defaults(model, answer_chars=longest)


_MAX_LINE = 130  # the repository's E501 limit ([tool.ruff.lint.pycodestyle] max-line-length)


def _constant(name: str, value: str | None) -> str:
    line = f"{name} = {value!r}"
    return f"{line}  # noqa: E501" if len(line) > _MAX_LINE else line


def client_source(options: StudyOptions, eval_every: int = 5) -> str:
    """A study client that trains on the data file (``swarm.data``), for ``swarm run`` and the preflight."""
    if options.data is None:
        raise ValueError("not a data study: no data file")
    heldout = "heldout=HELDOUT" if options.heldout else f"heldout_fraction={HELDOUT_FRACTION!r}"
    # Paths and names the user gave go in constants, one a line: the generated file passes the repository's
    # own lint wherever it is written (a path too long for a line says so with a noqa).
    constants = "\n".join(_constant(name, value) for name, value in (
        ("DATA", options.data), ("DATA_SHA256", options.data_sha256), ("HELDOUT", options.heldout),
        ("REWARD", options.reward), ("PROMPT_KEY", options.prompt_key), ("ANSWER_KEY", options.answer_key)))
    return f'''"""The data task of this study, generated by `researcher start --data`: the data file and its sha256 when the
study started, the reward and the held-out split are the constants below ({"a held-out file" if options.heldout else
f"held out: {HELDOUT_FRACTION:g} of the rows by a stable hash"}).
"""

from swarm.client import run_study_cli
from swarm.data import DataOptions, build_study

{constants}
GROUP_SIZE = 8
CONCURRENCY = 16
EVAL_EVERY = {eval_every}
REWARD_RANGE = {REWARD_RANGE!r}

_study = build_study(DataOptions(
    data=DATA, {heldout}, reward=REWARD, epochs={EPOCHS}, warmup_steps={options.warmup_steps},
    group_size=GROUP_SIZE, concurrency=CONCURRENCY, eval_every=EVAL_EVERY, prompt_key=PROMPT_KEY,
    answer_key=ANSWER_KEY))
tasks = _study.tasks
heldout = _study.heldout
workflow = _study.workflow
setup = _study.setup

if __name__ == "__main__":
    run_study_cli(__file__)
'''
