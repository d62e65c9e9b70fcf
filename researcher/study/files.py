"""The study folder's small text files: study.toml, plan.json, experiments/, LOG.md, report.md.

These are what a person reviews (and may commit), so they are plain, stable text. The TOML
writer covers what configs hold here: scalars, lists of scalars and one level of tables. Keys come
from the planner too (experiment overrides): an override key must look like a config key, and every
key is written bare only when TOML reads it as one plain key, else quoted, so no key can open a table.
Whether the server accepts a config (its keys and values) only the server knows: ``check_configs``
asks it (``swarm serve --check``) before anything runs. Each experiment folder is self-contained:
its client.py carries the experiment's client factor levels (``set_factors``).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
import os
import re
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from researcher.findings.records import IterationPlan, JsonObject, LookPlan, PlanFile, SequentialDesign
from researcher.study.layout import StudyLayout
from swarm.atomic import write_atomic

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_CONFIG_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")  # the server's config keys: lowercase snake_case


def _toml_key(key: str) -> str:
    key = str(key)
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} to TOML")


def dumps_toml(data: Mapping[str, object], header: str = "") -> str:
    lines = [f"# {line}" for line in header.splitlines()]
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and v and all(not isinstance(x, dict) for x in v.values())
              and k in ("server", "study", "budget", "options", "llm")}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for name, table in tables.items():
        lines.append(f"\n[{name}]")
        lines.extend(f"{_toml_key(key)} = {_toml_value(value)}" for key, value in table.items())
    return "\n".join(lines) + "\n"


def append_whole(path: Path, text: str) -> None:
    """Append ``text`` whole or not at all: a write the disk cuts short is truncated back to where it
    began, and the error re-raised, so a reader of the file only ever sees whole lines."""
    data = memoryview(text.encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]  # a short write, then ENOSPC on the next
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def check_overrides(overrides: JsonObject) -> JsonObject:
    """The planner's config overrides, refused (ValueError) unless every key looks like a server config
    key; the server itself refuses a well-formed key it does not know when the run starts."""
    bad = [key for key in overrides if not isinstance(key, str) or not _CONFIG_KEY.fullmatch(key)]
    if bad:
        raise ValueError(f"invalid config override key(s) {', '.join(map(repr, bad))}: a key is a server config "
                         "name of 1-64 lowercase letters, digits or '_' (e.g. 'group_size')")
    return overrides


def server_config(example_config: Path, overrides: JsonObject) -> JsonObject:
    """The example's flat server config (or its [server] table) with ``overrides`` applied."""
    data = tomllib.loads(example_config.read_text())
    return {**data.get("server", data), **check_overrides(overrides)}


class ConfigCheckError(RuntimeError):
    """``swarm serve --check`` could not be run or answered something unreadable (not a config problem)."""


def check_configs(swarm_command: Sequence[str], configs: Mapping[str, JsonObject],
                  timeout_s: float = 120.0) -> dict[str, str]:
    """Ask the server's own validation about every config at once; ``{name: why}`` for those it refuses.

    One ``swarm serve --check --config A --config B …`` process for all of a plan's configs: it validates
    each file (keys and values, the engine keys too) as ``swarm serve`` would and loads no model."""
    if not configs:
        return {}
    with tempfile.TemporaryDirectory(prefix="config-check-") as tmp:
        paths = {}
        for index, (name, config) in enumerate(configs.items()):
            paths[name] = Path(tmp) / f"{index:02d}.toml"
            paths[name].write_text(dumps_toml(config))
        argv = [*swarm_command, "serve", "--check", *(a for p in paths.values() for a in ("--config", str(p)))]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigCheckError(f"could not run `swarm serve --check`: {exc}") from exc
    answers = {}
    for line in done.stdout.splitlines():
        path, _, verdict = line.partition(": ")
        answers[path.strip()] = verdict.strip()
    if done.returncode not in (0, 2) or any(str(p) not in answers for p in paths.values()):
        raise ConfigCheckError(f"`swarm serve --check` exited {done.returncode} without a verdict for every config: "
                               f"{(done.stderr or done.stdout)[-1000:]}")
    return {name: answers[str(p)].removeprefix("invalid server settings: ") for name, p in paths.items()
            if answers[str(p)] != "ok"}


def set_factors(source: str, levels: Mapping[str, Any]) -> str:
    """``source`` with its top-level ``FACTORS = {...}`` assignment replaced by one holding ``levels``
    (over the defaults it lists), the rest of the file byte for byte; ``source`` as is when ``levels`` is
    empty. ``ValueError`` (a message for the planner's repair step) when the client declares no FACTORS dict
    literal, or ``levels`` names a factor it does not declare, or a level cannot be written as a literal."""
    if not levels:
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"the client does not compile, so its FACTORS cannot be set: {exc}") from None
    found = [node for node in tree.body
             if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FACTORS" for t in node.targets))
             or (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "FACTORS")]
    names = ", ".join(sorted(map(str, levels)))
    if not found:
        raise ValueError(f"the experiment sets client factor(s) {names}, but the client has no top-level "
                         "`FACTORS = {...}` assignment: declare FACTORS as a dict literal of every client factor and "
                         "its default level, and read the levels from it (FACTORS[\"name\"])")
    if len(found) > 1:
        raise ValueError(f"the client assigns FACTORS {len(found)} times at top level; keep exactly one dict literal")
    node = found[0]
    try:
        defaults = ast.literal_eval(node.value) if node.value is not None else None
    except ValueError:
        defaults = None
    if not isinstance(defaults, dict):
        raise ValueError("the client's FACTORS is not a dict literal (e.g. FACTORS = {\"tool\": True}); the researcher "
                         "sets each experiment's levels there")
    unknown = sorted(str(k) for k in levels if k not in defaults)
    if unknown:
        raise ValueError(f"the experiment sets client factor(s) {', '.join(unknown)} that the client's FACTORS does not "
                         f"declare (it declares: {', '.join(map(str, defaults)) or 'nothing'})")
    merged = {**defaults, **levels}
    text = repr(merged)
    try:
        if ast.literal_eval(text) != merged:
            raise ValueError
    except (ValueError, SyntaxError):
        raise ValueError("client factor levels must be plain literals (numbers, strings, booleans, lists): "
                         f"{merged!r}") from None
    value = node.value
    assert value is not None and value.end_lineno is not None and value.end_col_offset is not None
    lines = source.encode().splitlines(keepends=True)
    start = sum(len(line) for line in lines[:value.lineno - 1]) + value.col_offset  # ast offsets are UTF-8 bytes
    end = sum(len(line) for line in lines[:value.end_lineno - 1]) + value.end_col_offset
    raw = source.encode()
    return (raw[:start] + text.encode() + raw[end:]).decode()


def write_study_toml(layout: StudyLayout, topic: str, planner: str, options: Mapping[str, object],
                     deadline: float) -> None:
    data = {"study": {"id": layout.study_id, "topic": topic, "planner": planner,
                      "created": _now(), "deadline": _iso(deadline)},
            "options": {k: v for k, v in options.items() if v is not None}}  # TOML has no null: unset is absent
    write_atomic(layout.study_toml, dumps_toml(data, "Written by `researcher start`; the plan and results are "
                                                     "in plan.json, LOG.md and report.md."))


def read_study_toml(layout: StudyLayout) -> JsonObject:
    try:
        return tomllib.loads(layout.study_toml.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def write_plan(layout: StudyLayout, iteration: int, plan: IterationPlan, framing: JsonObject,
               design: SequentialDesign | None = None) -> None:
    """plan.json keeps every iteration's plan and the study's decision rule (hypotheses and looks are
    written here before any run)."""
    current = read_plan(layout)
    current.framing = framing
    if design is not None:
        current.design = design
    written = IterationPlan.model_validate({"written": _now(), **plan.dump()})
    current.iterations = {**current.iterations, iteration: written}
    write_atomic(layout.plan_json, json.dumps(current.dump(), indent=2, default=str) + "\n")


def write_design(layout: StudyLayout, design: SequentialDesign) -> None:
    """The study's decision rule in plan.json, amended (the pilot's sizing) before the next look is planned."""
    current = read_plan(layout)
    current.design = design
    write_atomic(layout.plan_json, json.dumps(current.dump(), indent=2, default=str) + "\n")


def amend_look(layout: StudyLayout, iteration: int, look: LookPlan) -> None:
    """An iteration's registered look, amended before its analysis (a pilot that is the only look)."""
    current = read_plan(layout)
    current.iterations[iteration].look = look
    write_atomic(layout.plan_json, json.dumps(current.dump(), indent=2, default=str) + "\n")


def read_plan(layout: StudyLayout) -> PlanFile:
    """plan.json as a model (an empty plan when there is none yet)."""
    if not layout.plan_json.is_file():
        return PlanFile()
    return PlanFile.model_validate_json(layout.plan_json.read_text())


def write_experiment(layout: StudyLayout, name: str, client_code: str, config: JsonObject,
                     hypothesis: str) -> Path:
    folder = layout.experiment_dir(name)
    write_atomic(folder / "client.py", client_code)
    write_atomic(folder / "config.toml", dumps_toml(config, f"experiment {name} (tests {hypothesis}); "
                                                             "flat swarm server config keys"))
    return folder


def log(layout: StudyLayout, text: str) -> None:
    """Append a dated entry to LOG.md (findings, decisions and negative results alike)."""
    layout.log_md.parent.mkdir(parents=True, exist_ok=True)
    header = "" if layout.log_md.is_file() else f"# Log of study {layout.study_id}\n\n"
    append_whole(layout.log_md, f"{header}- **{_now()}** {text.strip()}\n")


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")
