"""The box planner-written study code runs in: a static import check, a clean environment, resource
limits and a process group that is killed whole.

Study code (a ``client.py`` the planner wrote) runs inside ``swarm run`` for smoke runs and training
runs. Four layers, one job each:

- ``check_client``: before anything runs, the source's imports must come from an allow-list
  (``swarm.client``, ``openai``, ``httpx`` and pure standard-library modules) and it may not name the
  dynamic-code and escape hatches (``eval``, ``exec``, ``__import__``, ``open``, ``os.system``…). A
  violation is a validation error whose text the repair loop shows the planner.
- ``study_env``: the process gets an allow-listed environment (PATH, LANG, HOME = the run dir, the
  client credential, the interpreter's thread count), so the researcher's secrets
  (``OPENAI_API_KEY``, ``AWS_*``, ``MLFLOW_*``…) never reach it. The client token is enough for a
  study's ``setup``: the server lets it warm up a fresh server once (``swarm.server.http.routes_control``).
- ``Limits``: CPU time, address space, file size, open files and core dumps, set with
  ``setrlimit`` in the child between fork and exec (visible in ``/proc/<pid>/limits``).
- ``run_boxed``: a foreground run (the smoke run) in its own session and process group; on timeout,
  and after it ends, the whole group is killed, so a grandchild it left behind does not outlive it.

What the box is not: a security boundary against code written to escape it. The study code runs
as the researcher's user (it could read files that user can read), a static check cannot see
``getattr`` with computed names, and a process that calls ``setsid`` leaves the group. The box
stops what an LLM-written client plausibly does by mistake or by imitation, and keeps credentials
out of the places such code looks (environment, argv).
"""

from __future__ import annotations

import ast
import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from researcher.runs import detached
from swarm import box

# ---------------------------------------------------------------------------- static check

# Importable by study code: these packages with their submodules, and the standard-library modules
# below exactly (no processes, sockets, files, native code or import machinery among them).
ALLOWED_PACKAGES = ("swarm.client", "swarm.data", "openai", "httpx")  # swarm.data: a data task's generated client
ALLOWED_STDLIB = frozenset({
    "__future__", "abc", "array", "base64", "binascii", "bisect", "calendar", "cmath", "collections",
    "collections.abc", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "enum",
    "fractions", "functools", "hashlib", "heapq", "hmac", "html", "itertools", "json", "logging", "math",
    "numbers", "operator", "pprint", "queue", "random", "re", "secrets", "statistics", "string", "struct",
    "textwrap", "threading", "time", "typing", "unicodedata", "uuid", "warnings", "zlib",
})
# Names study code may not use at all: dynamic code, the import machinery, direct file access.
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "__import__", "open", "breakpoint", "globals",
                             "__builtins__", "__loader__", "__spec__"})
# Attributes that reach processes, the environment or the interpreter's insides from an allowed object
# (``logging.os.system``, ``random._os``, ``().__class__.__subclasses__()``).
FORBIDDEN_ATTRIBUTES = frozenset({"os", "_os", "sys", "_sys", "subprocess", "system", "popen", "environ",
                                  "__subclasses__", "__globals__", "__builtins__", "__code__", "__import__"})


def allowed_module(name: str) -> bool:
    return name in ALLOWED_STDLIB or any(name == p or name.startswith(p + ".") for p in ALLOWED_PACKAGES)


def check_client(source: str, filename: str = "client.py") -> str | None:
    """The import allow-list check of a study client; None when it passes, else the error for repair.

    Every violation is listed with its line; the last line summarises (the study log shows it)."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return f"{filename}:{exc.lineno}: syntax error: {exc.msg}"
    problems = [f"{filename}:{line}: {what}" for line, what in _violations(tree)]
    if not problems:
        return None
    allowed = ", ".join([*ALLOWED_PACKAGES, *sorted(ALLOWED_STDLIB)])
    return "\n".join([*problems,
                      f"Study code may import only these modules: {allowed}; and it may not use "
                      f"{', '.join(sorted(FORBIDDEN_NAMES))} or the attributes "
                      f"{', '.join(sorted(FORBIDDEN_ATTRIBUTES))}.",
                      f"{filename} failed the import check: {len(problems)} violation(s), the first: "
                      f"{problems[0].split(': ', 1)[1]}"])


def _violations(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"`import {alias.name}`: {alias.name} is not an allowed module")
                      for alias in node.names if not allowed_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "a relative import: a study client is one file"))
            elif not allowed_module(node.module or ""):
                # `from swarm import client` names an allowed module through its parent package.
                bad = [a.name for a in node.names if not allowed_module(f"{node.module}.{a.name}")]
                what = node.module if len(bad) == len(node.names) else ", ".join(f"{node.module}.{b}" for b in bad)
                if bad:
                    found.append((node.lineno, f"`from {node.module} import {', '.join(bad)}`: {what} is not an "
                                               "allowed module"))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append((node.lineno, f"`{node.id}` is not allowed in study code"))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append((node.lineno, f"the attribute `.{node.attr}` is not allowed in study code"))
    return sorted(found)


# ---------------------------------------------------------------------------- the OS sandbox


def box_flags(read: Sequence[Path] = ()) -> list[str]:
    """``swarm run``'s flags that run study code in the OS sandbox (``swarm.box``: namespaces, seccomp, only
    its server's port) where this machine can build it, letting it read ``read`` too (a data study's files,
    ``datatask.readable``); none where it cannot (the researcher then refuses LLM-written code unless the
    study allows it unboxed: ``unboxed_refusal``)."""
    if box.missing():
        return []
    return ["--box", *(flag for path in read for flag in ("--box-read", str(path)))]


def unboxed_refusal(llm_written: bool, allow_unboxed: bool) -> str | None:
    """Why study code may not run here (None: it may): LLM-written code needs the OS sandbox, unless
    ``allow_unboxed`` (``researcher start --allow-unboxed``), which the report then states."""
    missing = box.missing()
    if missing is None or not llm_written or allow_unboxed:
        return None
    return (f"the OS sandbox for LLM-written study code cannot be built on this machine: {missing}. "
            "Fix that, or pass --allow-unboxed to run the code with only the static check, a clean "
            "environment and resource limits (the report will say so).")


# ---------------------------------------------------------------------------- environment

# Taken from the researcher's environment when set: finding programs, the locale, and the import path
# the researcher itself runs with (so `swarm run` imports the same swarm). Nothing else is inherited.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
CLIENT_TOKEN_ENV = "SWARM_CLIENT_TOKEN"


def study_env(home: Path, *, client_token: str | None, threads: int = 1,
              source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a boxed process: the allow-listed variables of ``source`` (default
    ``os.environ``), HOME = ``home``, thread counts and, if given, the client credential."""
    source = os.environ if source is None else source
    env = {key: source[key] for key in INHERITED_ENV if key in source}
    env.setdefault("PATH", os.defpath)
    env["HOME"] = str(home)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"  # tracebacks reach the log even when the process is killed
    if client_token:
        env[CLIENT_TOKEN_ENV] = client_token
    return env


# ---------------------------------------------------------------------------- limits

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Resource limits of one boxed process (soft = hard, except CPU: SIGXCPU first, SIGKILL 10 s later).

    Sized from a real tiny-model client (``swarm run`` of the example clients, measured here): the
    letters client at 32 episodes in flight peaked at 84 MB resident, 1.6 GB address space (thread
    stacks and malloc arenas, mostly untouched), 69 open files and 12 ms CPU per episode; the
    calculator client at 128 in flight at 102 MB resident, 3.1 GB address space, 193 files and
    42 ms CPU per episode (SFT warm-up included). The limits leave 2x on address space, 5x on files
    and more than 10x on CPU; a runaway allocation, log or loop hits them instead of the machine.
    """

    cpu_s: int
    address_space: int = 6 * GIB
    file_size: int = 256 * MIB
    open_files: int = 1024

    @classmethod
    def for_episodes(cls, episodes: int) -> Limits:
        """CPU time for ``episodes`` episodes: 5 minutes of start-up slack plus 0.5 s per episode."""
        return cls(cpu_s=300 + int(0.5 * max(episodes, 0)))

    def apply(self) -> None:
        """Set the limits on the calling process (the child, between fork and exec: ``preexec_fn``)."""
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s + 10))
        resource.setrlimit(resource.RLIMIT_AS, (self.address_space, self.address_space))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_size, self.file_size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a core dump would hold the process's credential


# ---------------------------------------------------------------------------- foreground runs


@dataclass(frozen=True)
class Finished:
    """How a boxed run ended: its exit code (None when it was killed on timeout) and its output."""

    returncode: int | None
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        """How the process ended, naming the limit behind a signal (what the repair loop reads)."""
        code = self.returncode
        if code is None:
            return "was killed at its timeout"
        if code >= 0:
            return f"exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = _LIMIT_SIGNALS.get(-code)
        return f"was killed by {name}" + (f" ({why})" if why else "")


_LIMIT_SIGNALS: dict[int, str] = {
    signal.SIGXCPU: "it reached its CPU time limit",
    signal.SIGXFSZ: "it wrote past its file size limit",
    signal.SIGKILL: "the hard CPU time limit or the kernel's out-of-memory killer",
}


def run_boxed(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, limits: Limits,
              timeout_s: float) -> Finished:
    """Run ``argv`` in its own process group with exactly ``env`` and ``limits``; stdout+stderr are
    captured. On timeout the whole group is killed (``returncode`` None unless ``argv`` itself had
    ended); after a normal end, whatever the run left behind in its group is killed too."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=cwd, env=dict(env), start_new_session=True, preexec_fn=limits.apply)
    started = detached.start_time(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        returncode = proc.poll()  # not None: it ended, but something it started still holds the pipe
        kill_group(proc.pid)
        try:
            out, _ = proc.communicate(timeout=10.0)
        except subprocess.TimeoutExpired:  # a process that left the group still holds the pipe
            out = b""
    detached.stop_group(proc.pid, started, grace_s=0.0)  # leftovers of a run that ended on its own
    return Finished(returncode, out.decode(errors="replace"))


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (our child leads it, so the id cannot be reused yet)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
