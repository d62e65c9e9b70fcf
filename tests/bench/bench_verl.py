"""Benchmark: letters training speed with the in-process torch trainer vs verl on Ray (1 and 2 workers).

Three real ``swarm serve`` processes, one after the other in this run, all on the tiny preset with
the letters config and the default torch generator: ``--trainer torch``, ``--trainer verl --workers
1`` and ``--trainer verl --workers 2`` (FSDP2 over gloo on CPU). Each: ``swarm run`` the letters
client, wait for the first training step, then count the steps whose metrics are stamped within the
next ``--seconds`` (start-up and the first step excluded; the window method is shared with
``bench_vllm.py``). With ``--repeats N`` each setting is measured N times, the settings interleaved
(torch, verl 1, verl 2, torch, ...), and the best window of each is compared.

Printed for information: the server's start-up, Ray's and the verl workers' start-up (from the
server's log), and mean ``perf/step_s`` and ``perf/train_s`` over the window, i.e. how much of a step
the update takes. On CPU with two shared cores the story is Ray's and FSDP's fixed cost per update
on a 394k-parameter model; two workers can only be slower here, the scaling is a GPU question.

Ends with ``RESULT verl_over_torch=<verl 1 worker steps/s / torch> verl2_over_verl1=<verl 2 / verl 1>``.

    .venv/bin/python tests/bench/bench_verl.py [--seconds 45] [--repeats 1]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared window method in bench_vllm.py

from bench_vllm import Server, Window, letters_window, serve

SETTINGS = {  # label -> swarm serve flags
    "torch": ("--trainer", "torch"),
    "verl 1 worker": ("--trainer", "verl", "--workers", "1"),
    "verl 2 workers": ("--trainer", "verl", "--workers", "2"),
}
_VERL_READY = re.compile(r"verl trainer: (\d+) FSDP2 worker\(s\) on (\w+) ready in ([\d.]+) s \(Ray ([\d.]+) s\)")


def _startup(server: Server) -> str:
    text = f"server ready in {server.ready_s:.1f} s"
    found = _VERL_READY.search(server.log_text())
    if found:
        workers, device, ready, ray = found.groups()
        text += f" (Ray {float(ray):.1f} s, Ray + {workers} FSDP2 worker(s) on {device} {float(ready):.1f} s)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="letters measurement window per setting")
    parser.add_argument("--repeats", type=int, default=1, help="windows per setting, interleaved (best is kept)")
    args = parser.parse_args()

    windows: dict[str, list[Window]] = {label: [] for label in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="bench-verl-") as tmp:
        work = Path(tmp)
        for repeat in range(args.repeats):
            for index, (label, flags) in enumerate(SETTINGS.items()):
                name = f"r{repeat}-{index}"
                with serve(work, name, *flags) as server:
                    print(f"{label}: {_startup(server)}", flush=True)
                    windows[label].append(letters_window(server, work, f"letters {label}", args.seconds))

    best = {label: max(runs, key=lambda w: w.steps_per_s) for label, runs in windows.items()}
    for label, runs in windows.items():
        print(best[label].describe(("perf/step_s", "perf/train_s")) +
              (f" (runs: {', '.join(f'{w.steps_per_s:.3f}' for w in runs)} steps/s)" if len(runs) > 1 else ""))
    rate = {label: w.steps_per_s for label, w in best.items()}
    verl_over_torch = rate["verl 1 worker"] / rate["torch"] if rate["torch"] else float("nan")
    verl2_over_verl1 = rate["verl 2 workers"] / rate["verl 1 worker"] if rate["verl 1 worker"] else float("nan")
    print(f"RESULT verl_over_torch={verl_over_torch:.3f} verl2_over_verl1={verl2_over_verl1:.3f}")


if __name__ == "__main__":
    main()
