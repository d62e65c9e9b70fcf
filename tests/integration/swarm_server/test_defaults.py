"""Model-scaled defaults in ``swarm serve`` (``swarm.defaults.server_defaults``,
``swarm.config.starting_config``): a pretrained model starts from values scaled to its size where no
``--config`` file or flag sets a key, what the user sets always wins, random weights (a preset, or a
folder a preset built) keep ``ServerConfig``'s own, and ``swarm status`` names the defaults taken
(slow: a bare ``swarm serve --model smollm2-135m``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import ROOT, SWARM, ServeProcess, free_port

from swarm.config import ServerConfig, starting_config

SCALED_135M = {"lr": 1e-5, "max_tokens": 96, "max_staleness": 4, "micro_batch_tokens": 2048, "eval_hold_s": 300.0}


def test_a_pretrained_model_starts_from_defaults_scaled_to_it() -> None:
    config, defaults = starting_config("smollm2-135m", {})
    assert {key: getattr(config, key) for key in SCALED_135M} == SCALED_135M
    assert (defaults.source, defaults.keys, defaults.resumed) == ("model-scaled", SCALED_135M, False)


def test_what_a_config_or_flag_sets_wins_over_the_scaled_defaults() -> None:
    config, defaults = starting_config("smollm2-135m", {"lr": 3e-4, "max_tokens": 8, "group_size": 4})
    assert (config.lr, config.max_tokens, config.group_size, config.max_staleness) == (3e-4, 8, 4, 4)
    assert defaults.keys == {"max_staleness": 4, "micro_batch_tokens": 2048, "eval_hold_s": 300.0}  # only those taken


def test_random_weights_keep_the_built_in_defaults(bpe_model: Path) -> None:
    for model in ("tiny", str(bpe_model)):  # a folder a preset built, served by path: still random weights
        config, defaults = starting_config(model, {"lr": 2e-3})
        assert config == ServerConfig(lr=2e-3) and (defaults.source, defaults.keys) == ("built-in", {}), model


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_bare_serve_of_smollm2_trains_at_its_scaled_lr_and_says_so(tmp_path: Path) -> None:
    """Acceptance: ``swarm serve --model smollm2-135m`` with no --config has lr 1e-5 in
    ``GET /api/v1/config``, and ``swarm status`` (table and --json) names the defaults it took."""
    server = ServeProcess(port=free_port(), state_dir=tmp_path / "state", model="smollm2-135m")
    server.start(timeout_s=300)
    try:
        with server.http() as http:
            values = http.get("/api/v1/config").json()["values"]
        assert {key: values[key] for key in SCALED_135M} == SCALED_135M
        env = {k: v for k, v in os.environ.items() if k != "SWARM_TOKEN"}
        shown = [subprocess.run([*SWARM, "status", server.url, "--state-dir", str(server.state_dir), *json_],
                                cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
                 for json_ in ((), ("--json",))]
        assert all(done.returncode == 0 for done in shown), [done.stderr for done in shown]
        (row,) = [line for line in shown[0].stdout.splitlines() if "│ defaults " in line]
        assert ("model-scaled for smollm2-135m: eval_hold_s=300.0  lr=1e-05  max_staleness=4  max_tokens=96  "
                "micro_batch_tokens=2048") in row, shown[0].stdout
        status = json.loads(shown[1].stdout)
        assert status["defaults"] == {"source": "model-scaled", "keys": SCALED_135M, "resumed": False}
    finally:
        server.stop()
