"""Benchmark: does the same topic get the same answer? Runs one topic N times on fresh seeds and counts
the verdict classes of the Answers.

Each repeat is the real ``researcher start`` CLI in a subprocess (offline planner: no LLM variables are
passed on), with the same budget and flags, ``--seed-base`` set apart per repeat (repeat i: i × 10,000,
so no run shares a seed with another repeat's), and its own temporary studies and artifacts dirs. The
class of each Answer is ``researcher.findings.verdicts.answer_class`` of its report's Answer paragraph.

Topics measured for issue #35 (the README's and two more the offline planner maps):

- "Does a larger GRPO group size make the letters task learn faster?" (the README study, ``--budget 10m``)
- "Does a learning rate of 3e-3 beat 3e-5 on letters?" (a large effect: the answer should be Yes)
- "A/A check: do two identical configurations of letters learn at different speeds?" (no effect: the answer
  should never be Yes/No)

Ends with one line: ``RESULT verdict_agreement=<k>/<n> verdict=<majority class>`` (the class as
``Verdict.name`` in lower case: yes, no, no_difference, below_minimum, inconclusive; ``none`` for an
Answer with no class, such as a failed study).

    .venv/bin/python tests/bench/bench_verdict.py --topic "…" --repeats 5 [--budget 10m] [--jobs 1]
        [--out DIR] [-- --steps-per-run 30 …]   # anything after -- goes to `researcher start`

With ``--out``, studies that finished in an earlier run into the same DIR are read back rather than rerun.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from researcher.findings.verdicts import Verdict, answer_class  # noqa: E402

SEED_SPACING = 10_000  # a study's seeds are seed_base + iteration * 1000 + k
_LLM_VARIABLES = ("RESEARCHER_LLM_BASE_URL", "RESEARCHER_LLM_MODEL", "OPENAI_API_KEY")


def _answer(report: Path) -> str:
    if not report.is_file():
        return ""
    text = report.read_text()
    return text.split("## Answer\n\n", 1)[1].split("\n\n", 1)[0].strip() if "## Answer\n\n" in text else ""


def _repeat(index: int, topic: str, budget: str, extra: list[str], out: Path) -> tuple[int, Verdict | None, str, float]:
    """One study on seeds of its own: (index, class, Answer, wall seconds). A study that finished in an earlier
    run of the bench into the same ``--out`` is read back, not rerun, so a long bench can span sessions; one
    cut short is started again from nothing."""
    sid = f"verdict-{index}"
    here = out / sid
    finished = here / "finished.json"
    if finished.is_file():
        answer = _answer(here / "studies" / sid / "report.md")
        return index, answer_class(answer), answer, float(json.loads(finished.read_text())["wall_s"])
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in _LLM_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])  # this checkout's code
    command = [str(ROOT / ".venv" / "bin" / "researcher"), "start", "--topic", topic, "--budget", budget,
               "--study-id", sid, "--seed-base", str(index * SEED_SPACING), "--studies-dir", str(here / "studies"),
               "--artifacts-dir", str(here / "artifacts"), *extra]
    started = time.monotonic()
    with open(here / "researcher.log", "w") as log:
        subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - started
    answer = _answer(here / "studies" / sid / "report.md")
    finished.write_text(json.dumps({"wall_s": wall}))
    return index, answer_class(answer), answer, wall


def _name(verdict: Verdict | None) -> str:
    return "none" if verdict is None else verdict.name.lower()


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", default="10m", help="each study's --budget (the README's: 10m)")
    parser.add_argument("--jobs", type=int, default=1, help="studies at once (1: they do not share the cores)")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the studies here (default: a temp dir); those finished there are read back")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-verdict-"))
    print(f"topic: {args.topic}\nbudget: {args.budget} · repeats: {args.repeats} · extra: {' '.join(extra) or '-'} "
          f"· studies in {out}", flush=True)
    classes: list[Verdict | None] = []
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = [pool.submit(_repeat, i, args.topic, args.budget, extra, out) for i in range(args.repeats)]
        for future in futures:
            index, verdict, answer, wall = future.result()
            classes.append(verdict)
            print(f"repeat {index} (seed base {index * SEED_SPACING}, {wall:.0f} s): {_name(verdict)}\n  {answer}",
                  flush=True)
    (majority, count), = collections.Counter(classes).most_common(1)
    print(f"RESULT verdict_agreement={count}/{len(classes)} verdict={_name(majority)}")


if __name__ == "__main__":
    main()
