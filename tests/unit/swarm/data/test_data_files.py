"""``swarm.data`` in process: both row formats, the held-out split, epochs and seeds, and the reward
probe that refuses a bad file or reward with its file, row and reason (no server needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarm.data import DataError, DataOptions, build_study, file_sha256, read_rows

ROOT = Path(__file__).resolve().parents[4]
ARITH = ROOT / "studies" / "examples" / "arith"


def plain_rows(n: int) -> list[dict]:
    return [{"prompt": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_verl_rows_from_parquet_are_read_as_verl_writes_them() -> None:
    rows = read_rows(ARITH / "train.parquet")
    assert len(rows) == 2000
    first = rows[0]
    assert first.data_source == "openai/gsm8k" and first.messages[0]["role"] == "user"
    assert first.answer == f"#### {first.ground_truth}" and first.number == 1


def test_plain_rows_split_by_a_stable_hash_and_never_trained(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "plain.jsonl", plain_rows(200))
    options = DataOptions(data=data, reward="exact", heldout_fraction=0.2, epochs=2)
    study, again = build_study(options), build_study(options)
    held = {t["ground_truth"] for t in study.heldout()}
    assert held == {t["ground_truth"] for t in again.heldout()} and 20 <= len(held) <= 60
    trained = list(study.tasks(0))
    assert len(trained) == 2 * (200 - len(held)) and not held & {t["ground_truth"] for t in trained}
    assert [t["task_id"] for t in trained] == [t["task_id"] for t in study.tasks(0)]  # a seed is a fixed order
    assert [t["task_id"] for t in trained] != [t["task_id"] for t in study.tasks(1)]
    task = trained[0]
    assert study.reward(f" {task['ground_truth']} ", task) == 1.0 and study.reward("nope", task) == 0.0


def test_broken_line_57_names_file_line_and_reason(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "broken.jsonl", plain_rows(60))
    lines = data.read_text().splitlines()
    lines[56] = lines[56][:-5]
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        build_study(DataOptions(data=data, reward="exact"))
    assert (caught.value.file, caught.value.row) == (str(data), 57)
    assert f"{data}: line 57: not valid JSON" in str(caught.value)


def test_line_with_an_integer_past_pythons_digit_limit_is_refused_by_line(tmp_path: Path) -> None:
    """``json.loads`` raises a plain ``ValueError`` (not ``JSONDecodeError``, which has ``msg`` and
    ``colno``) for an integer of more than 4300 digits: it is still a ``DataError`` naming the line."""
    data = write_jsonl(tmp_path / "huge.jsonl", plain_rows(3))
    data.write_text(data.read_text() + '{"prompt": "p", "answer": ' + "1" * 5000 + "}\n")
    with pytest.raises(DataError) as caught:
        build_study(DataOptions(data=data, reward="exact"))
    assert (caught.value.file, caught.value.row) == (str(data), 4)
    assert "digit" in str(caught.value)


def test_parquet_without_prompt_column_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "noprompt.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1", "answer": "2"}]), data)
    with pytest.raises(DataError, match=r"noprompt.parquet: no 'prompt' column \(columns: question, answer\)"):
        build_study(DataOptions(data=data))


def test_row_without_ground_truth_is_refused(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", [*plain_rows(4), {"prompt": "no answer here"}])
    with pytest.raises(DataError, match=r"rows.jsonl: line 5: no ground truth"):
        build_study(DataOptions(data=data, reward="exact"))


def test_reward_that_raises_on_row_3_or_returns_nan_is_refused(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", plain_rows(10))
    (tmp_path / "rewards.py").write_text(
        "def raises(text, row):\n"
        "    if row['ground_truth'] == '3':\n"
        "        raise KeyError('no score for 3')\n"
        "    return 1.0\n"
        "def nan(text, row):\n"
        "    return float('nan')\n")
    with pytest.raises(DataError, match=r"rows.jsonl: line 3: the reward raised KeyError: 'no score for 3'"):
        build_study(DataOptions(data=data, reward=f"{tmp_path / 'rewards.py'}:raises"))
    with pytest.raises(DataError, match=r"rows.jsonl: line 1: the reward returned nan, not a finite number"):
        build_study(DataOptions(data=data, reward=f"{tmp_path / 'rewards.py'}:nan"))


def test_default_reward_is_verls_gsm8k_scorer_by_data_source() -> None:
    study = build_study(DataOptions(data=ARITH / "test.parquet", reward="verl"))
    task = study.heldout()[0] if study.heldout() else next(study.tasks(0))
    truth = task["ground_truth"]
    assert study.reward(f"#### {truth}", task) == 1.0
    assert study.reward(str(truth), task) == 0.0  # gsm8k's strict format wants "#### <answer>"
    assert not math.isnan(study.reward("", task))


def test_file_sha256_is_the_content_hash(tmp_path: Path) -> None:
    import hashlib

    data = write_jsonl(tmp_path / "rows.jsonl", plain_rows(3))
    assert file_sha256(data) == hashlib.sha256(data.read_bytes()).hexdigest()
