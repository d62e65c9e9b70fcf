"""Write the gsm-format example's data files: arith's word problems, asked of a real instruct model.

The problems are ``studies/examples/arith``'s (one-step additions and subtractions of single digits,
the same generator and the same disjoint train/test streams), with the format instruction appended
to the user message: SmolLM2-135M-Instruct can do the sums but rarely ends with the ``#### <n>``
line gsm8k's scorer wants when it samples at temperature 1.0 (3 of 32 replies), while greedy it
does so 12 times in 32 — the gap RL closes. Rows are verl's RL format (``data_source =
"openai/gsm8k"``, ``reward_model.ground_truth``), so verl's own scorer can grade them too. Deterministic::

    python studies/examples/gsm-format/make_data.py [--out DIR] [--train 2000] [--test 32]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTRUCTION = "Give the final answer as '#### <number>' on the last line."


def _arith():
    """arith's make_data module, loaded from its file (examples are folders, not a package)."""
    spec = importlib.util.spec_from_file_location("arith_make_data", HERE.parent / "arith" / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(train: int, test: int) -> tuple[list[dict], list[dict]]:
    """arith's rows with the instruction appended to each question."""
    rows = _arith().make(train, test)
    for split in rows:
        for item in split:
            item["prompt"] = [{"role": "user", "content": f"{item['extra_info']['question']} {INSTRUCTION}"}]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=32)
    args = parser.parse_args()
    arith = _arith()
    train_rows, test_rows = make(args.train, args.test)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train_rows), ("test", test_rows)):
        path = args.out / f"{name}.jsonl"
        arith.write(rows, path)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
