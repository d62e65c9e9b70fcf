"""Benchmark: how often is the researcher wrong? Runs null studies (no true difference) and studies of a
known large effect through the real ``researcher start`` CLI on the tiny model, and counts their Answers.

Nulls, taken in turn: an A/A check on letters and one on digits (two arms of the identical configuration,
sharing their seeds; the server's batching order still makes them differ, paired-difference sd about 0.02).
Not a knob that "cannot change learning": timeline merging exists only on the multi-turn calculator task,
where it does change learning, and letters trains asynchronously (``max_staleness = 1``), so importance
correction of stale samples changes it too.

The effect: learning rate 3e-3 against 3e-5 on letters (a large effect: the answer should be Yes).

A false positive is a Yes or a No on a null study; power is the share of effect studies answering Yes.
Each study is ``bench_verdict``'s repeat: its own seeds (``--seed-base``), its own studies and artifacts
dirs, no LLM variables passed on. Ends with one line:
``RESULT false_positive_rate=<x> power=<x> minutes_per_study=<m> studies=<n>``.

    .venv/bin/python tests/bench/bench_calibration.py --nulls 21 --effects 10 [--budget 10m] [--jobs 1]
        [--out DIR] [-- extra researcher start flags]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_verdict import _name, _repeat

from researcher.findings.verdicts import Verdict, resolved

NULLS = ("A/A check: do two identical configurations of letters learn at different speeds?",
         "A/A check: do two identical configurations of digits learn at different speeds?")
EFFECT = "Does a learning rate of 3e-3 beat 3e-5 on letters?"


def interleaved(nulls: int, effects: int) -> list[tuple[str, bool]]:
    """The studies as (topic, is_null), the effects spread evenly among the nulls so that a run cut short
    still has measured both rates."""
    order = sorted([((i + 0.5) / nulls, NULLS[i % len(NULLS)], True) for i in range(nulls)]
                   + [((i + 0.5) / effects, EFFECT, False) for i in range(effects)])
    return [(topic, null) for _, topic, null in order]


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nulls", type=int, default=21)
    parser.add_argument("--effects", type=int, default=10)
    parser.add_argument("--budget", default="10m", help="each study's --budget (the README's: 10m)")
    parser.add_argument("--jobs", type=int, default=1, help="studies at once (1: they do not share the cores)")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the studies here (default: a temp dir); those finished there are read back")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-calibration-"))
    topics = interleaved(args.nulls, args.effects)
    print(f"{args.nulls} null and {args.effects} effect studies · budget {args.budget} · studies in {out}", flush=True)
    started = time.monotonic()
    wrong = hits = 0
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = [(null, pool.submit(_repeat, i, topic, args.budget, extra, out))
                   for i, (topic, null) in enumerate(topics)]
        for null, future in futures:
            index, verdict, answer, wall = future.result()
            if null:
                wrong += verdict is not None and resolved(verdict)
            else:
                hits += verdict is Verdict.YES
            kind = "null" if null else "effect"
            print(f"study {index} ({kind}: {topics[index][0]}; {wall:.0f} s): {_name(verdict)}\n  {answer}", flush=True)
    minutes = (time.monotonic() - started) / 60 / max(len(topics), 1) * max(args.jobs, 1)
    print(f"RESULT false_positive_rate={wrong / max(args.nulls, 1):.3f} power={hits / max(args.effects, 1):.3f} "
          f"minutes_per_study={minutes:.1f} studies={len(topics)}")


if __name__ == "__main__":
    main()
