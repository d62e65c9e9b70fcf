"""Write the arith example's data files in verl's RL row format: short arithmetic word problems.

Each row is what verl's ``examples/data_preprocess/gsm8k.py`` writes: ``prompt`` (chat messages),
``data_source = "openai/gsm8k"`` (so verl's ``default_compute_score`` scores it: the reply must hold
``#### <answer>``), ``reward_model = {"style": "rule", "ground_truth": "<answer>"}`` and ``extra_info``
(split, index, and ``answer``: the reference reply ``#### <answer>`` a warm-up learns from). Problems
are one-step additions and subtractions of single digits, short because the tiny model is byte-level.
The test problems are drawn from their own RNG stream and never appear in train. Deterministic::

    python studies/examples/arith/make_data.py [--out DIR] [--train 2000] [--test 64] [--format jsonl|parquet]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Ann", "Bob", "Cy", "Di", "Ed", "Flo")
ITEMS = ("pens", "cups", "eggs", "hats")
DATA_SOURCE = "openai/gsm8k"


def problem(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} {item} and gets {b} more. How many now?", a + b
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {item} and loses {b}. How many now?", a - b


def row(question: str, answer: int, split: str, index: int) -> dict:
    return {"data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": index, "question": question, "answer": f"#### {answer}"}}


def make(train: int, test: int) -> tuple[list[dict], list[dict]]:
    test_rng, seen = random.Random("arith-test"), set()
    test_rows = []
    while len(test_rows) < test:
        question, answer = problem(test_rng)
        if question not in seen:
            seen.add(question)
            test_rows.append(row(question, answer, "test", len(test_rows)))
    train_rng, train_rows = random.Random("arith-train"), []
    while len(train_rows) < train:
        question, answer = problem(train_rng)
        if question not in seen:  # a test problem never appears in train
            train_rows.append(row(question, answer, "train", len(train_rows)))
    return train_rows, test_rows


def write(rows: list[dict], path: Path) -> None:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=64)
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    args = parser.parse_args()
    train_rows, test_rows = make(args.train, args.test)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train_rows), ("test", test_rows)):
        path = args.out / f"{name}.{args.format}"
        write(rows, path)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
