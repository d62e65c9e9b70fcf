"""Reading a data file into rows: verl's RL row format or plain prompt/answer rows, jsonl or parquet.

verl's format (what its ``examples/data_preprocess`` scripts write): ``prompt`` is a list of chat
messages, ``data_source`` names the scorer, ``reward_model.ground_truth`` is the reference answer and
``extra_info`` anything else (``extra_info.answer``, when present, is a full reference solution). Plain
rows are ``{"prompt": "…", "answer": "…"}``: the prompt becomes one user message and the answer is the
ground truth. Rows in neither shape are read through ``RowKeys``: ``--prompt-key question
--answer-key answer`` reads gsm8k's columns, the answer's ``#### n`` tail becoming the ground truth.
Every problem raises ``DataError`` naming the file (or dataset), the row (a jsonl line number, or a
parquet or dataset row counted from 1) and the reason, so bad data stops before anything is claimed.

pyarrow is imported only for parquet files; datasets by name or folder are read in ``_source``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict


class DataError(ValueError):
    """A data file (or its reward) that cannot be trained on: ``file``, ``row`` (None: the whole file) and why."""

    def __init__(self, file: Path | str, row: int | None, reason: str) -> None:
        self.file, self.row, self.reason = str(file), row, reason
        where = f"{file}" if row is None else f"{file}: {_unit(file)} {row}"
        super().__init__(f"{where}: {reason}")


def _unit(file: Path | str) -> str:
    return "line" if str(file).endswith((".jsonl", ".json")) else "row"


class DataTask(TypedDict):
    """The task a data file's workflow and reward receive: the row in verl's names."""

    task_id: str
    prompt: list[dict[str, str]]  # {role, content} messages
    data_source: str | None       # names verl's scorer
    ground_truth: Any             # whatever the file holds (a string, a number, a list, ...)
    extra_info: dict[str, object]
    answer: str | None


@dataclass(frozen=True)
class Row:
    """One training or held-out problem, normalised from either format."""

    file: str
    number: int                       # jsonl line number, or parquet row counted from 1
    messages: list[dict[str, str]]
    ground_truth: Any
    data_source: str | None = None
    extra_info: dict[str, object] = field(default_factory=dict)
    answer: str | None = None         # a reference completion for a supervised warm-up, if the row has one

    def task(self, task_id: str) -> DataTask:
        """The task dict a workflow receives (the row's number is not part of it: two rows holding the
        same problem are the same task, which is what the held-out disjointness check compares)."""
        return {"task_id": task_id, "prompt": self.messages, "data_source": self.data_source,
                "ground_truth": self.ground_truth, "extra_info": self.extra_info, "answer": self.answer}

    def key(self) -> str:
        """A stable hash of the problem (prompt and ground truth): what a held-out fraction splits on."""
        text = json.dumps([self.messages, self.ground_truth], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class RowKeys:
    """Which fields of a row hold the prompt and the answer (``--prompt-key`` / ``--answer-key``).

    The defaults read verl's rows and ``{prompt, answer}`` rows. With ``answer`` set, that field is the
    ground truth, reduced by ``final_answer`` (gsm8k's ``#### 42`` tail), and the whole of it, when it
    is text, the reference answer a supervised warm-up trains on."""

    prompt: str = "prompt"
    answer: str | None = None


def final_answer(value: Any) -> Any:
    """The ground truth in an answer field: the text after the last ``####`` when there is one (gsm8k's
    worked solutions end ``#### 1,234``), stripped and without thousands commas, as verl's gsm8k
    preprocessing extracts it; any other value unchanged."""
    if isinstance(value, str) and "####" in value:
        return value.rpartition("####")[2].strip().replace(",", "")
    return value


def read_file(path: Path | str, keys: RowKeys | None = None) -> list[Row]:
    """Every row of a ``.jsonl`` or ``.parquet`` file; ``DataError`` on the first bad one."""
    path, keys = Path(path), keys or RowKeys()
    if not path.is_file():
        raise DataError(path, None, "no such file")
    if path.suffix in (".jsonl", ".json"):
        records = _jsonl(path)
    elif path.suffix in (".parquet", ".pq"):
        records = _parquet(path, keys)
    else:
        raise DataError(path, None, f"unknown format {path.suffix!r}: use .jsonl or .parquet")
    return to_rows(path, records, keys)


def to_rows(source: Path | str, records: list[tuple[int, Any]], keys: RowKeys) -> list[Row]:
    """``(number, record)`` pairs as rows; ``DataError`` on the first bad one, or when there are none."""
    rows = [_row(source, number, record, keys) for number, record in records]
    if not rows:
        raise DataError(source, None, "it holds no rows")
    return rows


def _jsonl(path: Path) -> list[tuple[int, Any]]:
    records = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(path, None, f"cannot read it: {exc}") from exc
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(path, number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        except ValueError as exc:  # valid JSON Python will not read: an integer past its digit limit
            raise DataError(path, number, f"not readable JSON ({exc})") from None
    return records


def _parquet(path: Path, keys: RowKeys) -> list[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow ships with the project's dependencies
        raise DataError(path, None, "reading parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise DataError(path, None, f"not a readable parquet file: {type(exc).__name__}: {exc}") from None
    check_columns(path, table.column_names, keys)
    return list(enumerate(table.to_pylist(), start=1))


def check_columns(source: Path | str, columns: list[str], keys: RowKeys) -> None:
    """``DataError`` when a table lacks the prompt or answer column, before any row is converted."""
    for key in (keys.prompt, keys.answer):
        if key is not None and key not in columns:
            hint = "" if key != "prompt" else "; name the prompt's column with --prompt-key"
            raise DataError(source, None, f"no {key!r} column (columns: {', '.join(columns)}){hint}")


def _row(path: Path | str, number: int, record: Any, keys: RowKeys) -> Row:
    def bad(reason: str) -> DataError:
        return DataError(path, number, reason)

    if not isinstance(record, dict):
        raise bad(f"a row must be a JSON object, got {type(record).__name__}")
    if keys.prompt not in record:
        raise bad(f"no {keys.prompt!r} (keys: {', '.join(map(str, record)) or 'none'})")
    prompt = record[keys.prompt]
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt):
        messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    else:
        raise bad(f"{keys.prompt!r} must be a string or a non-empty list of {{role, content}} messages")
    reward_model = record.get("reward_model")
    if keys.answer is not None:
        if keys.answer not in record:
            raise bad(f"no {keys.answer!r} (keys: {', '.join(map(str, record))})")
        truth = final_answer(record[keys.answer])
    elif isinstance(reward_model, dict) and "ground_truth" in reward_model:
        truth = reward_model["ground_truth"]
    elif "answer" in record:
        truth = record["answer"]
    elif "ground_truth" in record:
        truth = record["ground_truth"]
    else:
        raise bad("no ground truth: give 'reward_model': {'ground_truth': …} (verl's format) or 'answer'")
    if truth is None or (isinstance(truth, float) and not math.isfinite(truth)):
        raise bad("the ground truth is empty")
    source = record.get("data_source")
    if source is not None and not isinstance(source, str):
        raise bad(f"'data_source' must be a string, got {type(source).__name__}")
    extra = record.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise bad(f"'extra_info' must be an object, got {type(extra).__name__}")
    answer_key = keys.answer or "answer"
    answer = record.get(answer_key) if isinstance(record.get(answer_key), str) else extra.get("answer")
    return Row(file=str(path), number=number, messages=messages, ground_truth=truth, data_source=source,
               extra_info=extra, answer=answer if isinstance(answer, str) else None)


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes (what study.toml records, so a re-run uses the same data)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
