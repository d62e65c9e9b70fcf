"""An ended run's checkpoints keep their weights and lose the optimizer state and KL reference."""

from __future__ import annotations

from pathlib import Path

from researcher.runs import record as runs
from researcher.runs import shedding
from researcher.runs.launcher import Launcher
from researcher.runs.record import RunRecord
from swarm.backends.torch import backend as torch_backend
from swarm.backends.verl import checkpoint as verl_checkpoint

WEIGHTS = ("model.safetensors", "config.json", "tokenizer.json", "backend_state.json")


def _state_dir(root: Path, steps: tuple[int, ...] = (4, 8)) -> Path:
    """A server state dir as `swarm serve` leaves it: checkpoints with weights, training state and meta."""
    for step in steps:
        weights = root / "checkpoints" / f"step-{step}" / "weights"
        weights.mkdir(parents=True)
        for name in (*WEIGHTS, *shedding.TRAINING_STATE_FILES):
            (weights / name).write_bytes(b"x" * 1000)
        (weights.parent / "meta.json").write_text("{}")
    (root / "buffer.db").write_bytes(b"db")
    return root


def _left(state_dir: Path) -> set[str]:
    return {str(p.relative_to(state_dir)) for p in state_dir.rglob("*") if p.is_file()}


def test_shedding_removes_the_training_state_of_every_checkpoint_and_nothing_else(tmp_path: Path) -> None:
    state_dir = _state_dir(tmp_path / "server")
    freed = shedding.shed_training_state(state_dir)
    assert freed == 2 * len(shedding.TRAINING_STATE_FILES) * 1000
    assert _left(state_dir) == {"buffer.db"} | {f"checkpoints/step-{s}/{f}" for s in (4, 8)
                                               for f in ("meta.json", *(f"weights/{w}" for w in WEIGHTS))}
    assert shedding.shed_training_state(state_dir) == 0  # nothing left to shed
    assert shedding.shed_training_state(tmp_path / "never-started") == 0


def test_the_names_are_the_trainers_own() -> None:
    """The researcher may not import the engines, so this holds its list to their constants."""
    assert {torch_backend._OPTIMIZER_FILE, torch_backend._REFERENCE_FILE, verl_checkpoint.OPTIMIZER_FILE,
            verl_checkpoint.REFERENCE_FILE} == set(shedding.TRAINING_STATE_FILES)
    assert verl_checkpoint.WEIGHTS_FILE not in shedding.TRAINING_STATE_FILES


def _ended(tmp_path: Path, launcher: Launcher, *, external: bool = False) -> set[str]:
    """Stop a run (its processes already gone) through ``launcher`` and list what its state dir keeps."""
    run_dir = tmp_path / "run"
    state_dir = _state_dir(run_dir / "server", steps=(8,))
    record = RunRecord(key="s/1/0", study_id="s", iteration=1, trial=0, experiment="e", seed=0, config={},
                       client="client.py", target_step=8, episodes=64, group_size=8, status="running", last_step=8,
                       state_dir=str(state_dir), external=external)
    runs.save(run_dir, record)
    ended = launcher.stop(run_dir, record, "finished", "reached step 8")
    assert ended.status == "finished"
    return {Path(p).name for p in _left(state_dir)}


def test_a_stopped_run_sheds_unless_the_study_keeps_it_or_the_server_is_someone_else_s(tmp_path: Path) -> None:
    assert not _ended(tmp_path / "ours", Launcher(["swarm"])) & set(shedding.TRAINING_STATE_FILES)
    kept = _ended(tmp_path / "kept", Launcher(["swarm"], keep_training_state=True))
    assert set(shedding.TRAINING_STATE_FILES) <= kept
    assert set(shedding.TRAINING_STATE_FILES) <= _ended(tmp_path / "external", Launcher(["swarm"]), external=True)
