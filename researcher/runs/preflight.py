"""The checks new study code passes before it trains, each failing with one precise message for repair.

``validate`` runs them in order, cheapest first, and stops at the first failure: compile → import
check (``sandbox.check_client``) → static contract → data probe → smoke run → reward checks.

- **Static contract** (read from the source, nothing runs): module-level ``tasks``, ``workflow``
  and ``heldout``, and a literal ``REWARD_RANGE = (low, high)``, finite, ``low < high``.
- **Data probe**: ``swarm run CLIENT.py --probe`` in the box (``sandbox.run_boxed`` with
  ``sandbox.study_env``, no credential, a short timeout): ``tasks(seed)`` deterministic per seed,
  seeds that differ, task ids, a non-empty ``heldout()`` disjoint from the tasks of a few seeds
  (``swarm.client.probe_study``). The probe lives in ``swarm.client`` because it runs where study code
  runs, with the interpreter that runs ``swarm run``, and people can run it on their own clients.
- **Reward checks**, on the ``--rewards-out`` lines of the smoke run (a fresh server: the untrained
  model, after the study's ``setup()``): every reward finite and inside ``REWARD_RANGE``; every episode
  produced one; and the reward is not constant within every GRPO group, since then every advantage is
  zero and GRPO learns nothing. The smoke samples whole groups for this (``smoke_size``).

Example clients used unchanged (the offline planner's; byte-identical to
``<examples>/<name>/client.py``) are exempt from the constant-reward check only: letters' untrained
reward is ~0.003, so most small samples are all zeros, yet it learns (measured: 0.003 -> 0.67 in 50 steps). The messages name
the offending values and say what to change; the first line of a failure is the whole verdict.
"""

from __future__ import annotations

import ast
import math
import traceback
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from researcher.runs import record as runs
from researcher.runs import sandbox
from swarm.client import ProbeReport, RewardRecord

REQUIRED = ("tasks", "workflow", "heldout")
PROBE_TIMEOUT_S = 30.0  # importing the client and drawing ~800 tasks takes about a second
PROBE_CPU_S = 60
PROBE_LOG = "probe.log"
REWARDS_FILE = "rewards.jsonl"
SMOKE_GROUP_SIZE = 4  # the smallest group whose rewards say something about variation
SMOKE_MIN_GROUPS = 2
CONSTANT_TOL = 1e-9  # a spread this small gives GRPO nothing but noise to normalise


@dataclass(frozen=True)
class Failure:
    """A failed check: which one, the one-line verdict, and the evidence (violations, log tail)."""

    check: str
    message: str
    detail: str = ""

    @property
    def text(self) -> str:
        """What the repair step receives: the verdict on the first line, the evidence below it."""
        return f"{self.message}\n{self.detail.strip()}" if self.detail.strip() else self.message


# ---------------------------------------------------------------------------- reading the source


def compile_check(source: str, filename: str) -> Failure | None:
    try:
        compile(source, filename, "exec")
    except SyntaxError as exc:
        trace = "".join(traceback.format_exception_only(exc))
        return Failure("compile", f"{filename}:{exc.lineno}: syntax error: {exc.msg}", trace)
    return None


def import_check(source: str, filename: str) -> Failure | None:
    """``sandbox.check_client`` as a failure: its summary (its last line) is the verdict."""
    error = sandbox.check_client(source, filename)
    return None if error is None else Failure("import check", error.strip().splitlines()[-1], error)


def check_contract(source: str, filename: str) -> tuple[float, float] | Failure:
    """The declared ``REWARD_RANGE`` if the module defines the study functions and declares it, else why not."""
    tree = ast.parse(source, filename)
    bound: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            bound[node.name] = node
        elif isinstance(node, ast.Assign):  # `tasks = ...` and `GROUP_SIZE, tasks = ...` alike
            names = [t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            bound.update({name.id: node for name in names if isinstance(name, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            bound[node.target.id] = node
    missing = [name for name in REQUIRED if name not in bound]
    if missing:
        return Failure("static contract", f"{filename} does not define {', '.join(f'{m}()' for m in missing)} at "
                                          "module level: a study client defines tasks(seed), workflow(ep, task) and "
                                          "heldout()")
    declared = bound.get("REWARD_RANGE")
    if declared is None:
        return Failure("static contract", f"{filename} does not declare REWARD_RANGE: add a module-level "
                                          "`REWARD_RANGE = (low, high)` with the lowest and highest reward workflow "
                                          "can return, e.g. REWARD_RANGE = (0.0, 1.0)")
    value_node = declared.value if isinstance(declared, ast.Assign | ast.AnnAssign) else None
    where = f"{filename}:{declared.lineno}: REWARD_RANGE"
    try:
        value = ast.literal_eval(value_node) if value_node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Failure("static contract", f"{where} must be a literal pair of numbers like (0.0, 1.0), not "
                                          f"`{ast.unparse(value_node)[:80] if value_node else '?'}`")
    if (not isinstance(value, tuple | list) or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
        return Failure("static contract", f"{where} must be a pair of numbers (low, high), got {value!r:.80}")
    low, high = float(value[0]), float(value[1])
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        return Failure("static contract", f"{where} = {value!r}: low and high must be finite with low < high")
    return low, high


def example_name(source: str, examples_root: Path) -> str | None:
    """The example study whose client ``source`` is byte for byte, else None."""
    for client in sorted(examples_root.glob("*/client.py")):
        if client.read_text() == source:
            return client.parent.name
    return None


# ---------------------------------------------------------------------------- the data probe


def run_probe(client: Path, work_dir: Path, swarm_command: Sequence[str], *, timeout_s: float = PROBE_TIMEOUT_S,
              threads: int = 1, read: Sequence[Path] = ()) -> ProbeReport | Failure:
    """``swarm run CLIENT --probe`` boxed in ``work_dir``, reading ``read`` too (its output kept in ``probe.log``)."""
    runs.private_dir(work_dir)
    done = sandbox.run_boxed([*swarm_command, "run", str(client), *sandbox.box_flags(read), "--probe"],
                             env=sandbox.study_env(work_dir, client_token=None, threads=threads), cwd=work_dir,
                             limits=sandbox.Limits(cpu_s=PROBE_CPU_S), timeout_s=timeout_s)
    (work_dir / PROBE_LOG).write_text(done.output)
    report = _probe_report(done.output)
    tail = done.output[-3000:]
    if report is None:
        if done.timed_out:
            return Failure("data probe", f"the data probe (import the client, draw tasks(seed) and heldout()) did "
                                         f"not finish within {timeout_s:.0f} s: a task generator that never yields, "
                                         "or one far too slow", tail)
        return Failure("data probe", f"the data probe {done.describe()} without a result", tail)
    if report.problems:
        return Failure("data probe", report.problems[0], "\n".join([*report.problems[1:], report.traceback]))
    return report


def _probe_report(output: str) -> ProbeReport | None:
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                return ProbeReport.model_validate_json(line)
            except ValidationError:
                continue
    return None


# ---------------------------------------------------------------------------- rewards of the smoke run


def smoke_size(smoke_episodes: int) -> tuple[int, int]:
    """(episodes, group size) of a smoke run: whole groups of 4, at least two of them."""
    groups = max(SMOKE_MIN_GROUPS, -(-smoke_episodes // SMOKE_GROUP_SIZE))
    return groups * SMOKE_GROUP_SIZE, SMOKE_GROUP_SIZE


def read_rewards(path: Path) -> list[RewardRecord]:
    """The smoke run's reward lines (none if it wrote no file; a line cut by a kill is skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(RewardRecord.model_validate_json(line))
        except ValidationError:
            continue
    return records


def check_rewards(records: list[RewardRecord], reward_range: tuple[float, float]) -> Failure | None:
    """Every reward finite and inside the declared range; every episode's workflow produced one."""
    low, high = reward_range
    declared = f"REWARD_RANGE = ({_num(low)}, {_num(high)})"
    bad = [r for r in records if r.reward is not None and not (math.isfinite(r.reward) and low <= r.reward <= high)]
    if bad:
        counts = Counter(_num(r.reward) for r in bad if r.reward is not None)
        shown = ", ".join(f"{value} ({n} episode{'s' * (n > 1)})" for value, n in counts.most_common(6))
        nonfinite = any(not math.isfinite(r.reward) for r in bad if r.reward is not None)
        why = ("a NaN or infinite reward is refused by the server and aborts its episode; " if nonfinite else "")
        return Failure("reward range",
                       f"{len(bad)} of {len(records)} smoke episodes returned a reward outside {declared}: {shown}; "
                       f"{why}make workflow return a finite reward inside the declared range, or declare the range "
                       "it really has",
                       "\n".join(f"task {r.task_id} ({r.purpose}): reward {_num(r.reward)}" for r in bad[:10]))
    failed = [r for r in records if r.reward is None]
    if failed:
        first = failed[0]
        return Failure("rewards", f"{len(failed)} of {len(records)} smoke episodes produced no reward; the first "
                                  f"(task {first.task_id}, {first.purpose}): {first.error}")
    return None


def check_variation(records: list[RewardRecord]) -> Failure | None:
    """The reward varies within at least one training group (else GRPO's advantages are all zero)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record.purpose == "train" and record.reward is not None and math.isfinite(record.reward):
            groups[record.group].append(record.reward)
    full = [rewards for rewards in groups.values() if len(rewards) >= 2]
    if not full:
        return Failure("reward variation", "the smoke run finished no GRPO group of 2 or more episodes, so whether "
                                           "the reward varies within a group is unknown: tasks(seed) must yield "
                                           "enough tasks for whole groups")
    if any(max(rewards) - min(rewards) > CONSTANT_TOL for rewards in full):
        return None
    episodes = sum(map(len, full))
    values = sorted({rewards[0] for rewards in full})
    what = (f"constant reward {_num(values[0])} in all {episodes} episodes / {len(full)} groups" if len(values) == 1
            else f"a reward constant within each of the {len(full)} groups ({', '.join(map(_num, values))}) in all "
                 f"{episodes} episodes")
    return Failure("reward variation", f"{what} of the smoke run: GRPO's advantages are all zero, so it learns "
                                       "nothing; adapt the task or the reward, e.g. partial credit, or an easier "
                                       "task level the untrained model sometimes solves")


def reward_summary(records: list[RewardRecord]) -> str:
    """What the reward checks saw, for LOG.md: ``12 rewards in [0, 0.25]; varying within 1 of 2 training groups``."""
    values = [r.reward for r in records if r.reward is not None]
    groups: dict[str, list[float]] = defaultdict(list)
    for record in records:
        if record.purpose == "train" and record.reward is not None:
            groups[record.group].append(record.reward)
    varying = sum(max(g) - min(g) > CONSTANT_TOL for g in groups.values() if len(g) >= 2)
    span = f"in [{_num(min(values))}, {_num(max(values))}]" if values else "none"
    return f"{len(values)} rewards {span}; varying within {varying} of {len(groups)} training groups"


def _num(value: float | None) -> str:
    return "None" if value is None else f"{value:.6g}"
