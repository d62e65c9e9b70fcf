"""What a run asks for, what this machine has, and which local GPUs a run gets.

A run's request (``Request``) is derived once from the study's options and the run's config: one
CPU (the tiny CPU model is latency-bound; a run's server and client share it), ``gpus_per_run``
GPUs (default: 1 on a machine that has GPUs, else 0), plus any custom resources named with
``--run-resources '{"GPU": 1, "node_b": 1}'`` (those keys win over the derived ones). The same
request is what the Ray launcher asks the cluster for.

GPU discovery (``discover_gpus``) is deliberately plain so tests can fake it:
1. ``CUDA_VISIBLE_DEVICES`` in the researcher's environment, if set, lists the devices it may use
   (``""`` or ``-1``: none);
2. otherwise ``nvidia-smi --query-gpu=index --format=csv,noheader`` found on ``PATH`` prints one index
   a line (a test puts a script printing ``0``…``3`` first on PATH to get four GPUs);
3. otherwise the machine has no GPU.

Local assignment (``assign``) gives each run whole devices of its own; a fractional request
(``gpus_per_run = 0.5``) shares a device with other fractional runs up to 1.0 per device and is never
put on a device a whole-device run holds. What is held is read from every live run record under the
artifacts root (all studies on this machine), so two studies sharing a machine do not collide and an
assignment survives a researcher restart (it is in run.json).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from researcher.runs import record as runs

GPU = "GPU"
CPU = "CPU"
_EPS = 1e-9


class Request(BaseModel):
    """The resources one run asks for (Ray's names: ``CPU``, ``GPU``, custom keys)."""

    model_config = ConfigDict(extra="forbid")

    amounts: dict[str, float] = Field(default_factory=dict)

    @property
    def gpus(self) -> float:
        return float(self.amounts.get(GPU, 0.0))

    @property
    def cpus(self) -> float:
        return float(self.amounts.get(CPU, 0.0))

    @property
    def custom(self) -> dict[str, float]:
        return {k: v for k, v in self.amounts.items() if k not in (CPU, GPU)}


def parse_run_resources(text: str | None) -> dict[str, float]:
    """``--run-resources`` JSON (``'{"GPU": 1}'``) as a dict of non-negative numbers."""
    if not text:
        return {}
    import json

    try:
        value = json.loads(text)
    except ValueError:
        raise ValueError(f"--run-resources must be a JSON object such as '{{\"GPU\": 1}}', got {text!r}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) and v >= 0 for k, v in value.items()):
        raise ValueError(f"--run-resources must map resource names to non-negative numbers, got {text!r}")
    return {k: float(v) for k, v in value.items()}


def check_gpu_amount(gpus: float) -> None:
    """Whole devices, or a fraction of one device (shared): 0.5 yes, 1.5 no."""
    if gpus < 0 or (gpus > 1 and not float(gpus).is_integer()):
        raise ValueError(f"a run asks for whole GPUs or a fraction of one, not {gpus}")


def request_for(options: Mapping[str, Any], config: Mapping[str, Any], machine_gpus: int) -> Request:
    """A run's request from the study options (``gpus_per_run``, ``run_resources``) and its config."""
    gpus = options.get("gpus_per_run")
    if gpus is None:
        gpus = 1.0 if machine_gpus else 0.0
    amounts = {CPU: 1.0, GPU: float(gpus)}
    amounts.update(options.get("run_resources") or {})
    check_gpu_amount(amounts.get(GPU, 0.0))
    return Request(amounts={k: v for k, v in amounts.items() if v > 0})


def discover_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU device ids runs may use (see the module doc for the order of sources)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        return [] if ids in ([], ["-1"]) else ids
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=20, env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def held(records: Iterable[runs.RunRecord], but: str | None = None) -> dict[str, float]:
    """GPU share held per device by local runs that hold devices (running, or reserved and starting;
    parking releases them, an ended run holds none), except run ``but``."""
    usage: dict[str, float] = {}
    for record in records:
        if record.key == but or record.ended or record.placement != "local":
            continue
        share = record.resources.get(GPU, 0.0)
        for device in record.devices:
            usage[device] = usage.get(device, 0.0) + (share if share < 1 else 1.0)
    return usage


def assign(request: Request, devices: list[str], usage: Mapping[str, float]) -> list[str] | None:
    """Devices for a run from what is free, or None when it must wait. [] for a run that asks none."""
    want = request.gpus
    if want <= 0:
        return []
    if want < 1:  # a share: packed onto the fullest device with room, so whole devices stay free for whole runs
        room = [d for d in devices if usage.get(d, 0.0) + want <= 1.0 + _EPS]
        return [min(room, key=lambda d: (-usage.get(d, 0.0), devices.index(d)))] if room else None
    free = [d for d in devices if usage.get(d, 0.0) <= _EPS]
    count = math.ceil(want)
    return free[:count] if len(free) >= count else None


def live_records(artifacts_root: Path) -> list[runs.RunRecord]:
    """Every run record of every study under ``artifacts_root`` (what holds this machine's GPUs)."""
    found = []
    for study in sorted(artifacts_root.iterdir()) if artifacts_root.is_dir() else []:
        found.extend(runs.all_records(study / "runs"))
    return found


def never_fits(request: Request, devices: list[str]) -> str | None:
    """Why a request can never be met by this machine (None when it can, given time)."""
    if request.gpus > len(devices) + _EPS:
        return (f"a run asks for {request.gpus:g} GPU(s) and this machine has {len(devices)} (set gpus_per_run / "
                "--run-resources, or CUDA_VISIBLE_DEVICES)")
    if request.custom:
        return (f"custom resources {sorted(request.custom)} can only be met on a Ray cluster (--ray-address); "
                "locally a run asks for CPU and GPU only")
    return None
