"""An ended run's checkpoints keep their weights and lose the state only resuming training needs.

Why: a run that ended (finished, cut, crashed, stopped …) is never resumed (``researcher.runs.status``:
ends are terminal), yet its server's last checkpoint holds the optimizer state and the KL reference
beside the weights. With Adam the optimizer state is twice the weights in fp32. On SmolLM2-135M a
checkpoint is 1.6 GB, of which the weights are 0.5 GB: the 42 runs of the project's SmolLM2 evidence
kept 68 GB and filled the disk.

The weights stay (a loadable Hugging Face folder: a reader may want the winning arm's model), and
both trainers still load what is left (their ``load`` restores the files it finds).
``keep_training_state`` (a study option) keeps everything, for a run someone will continue by hand.

The names are the trainers' own (the torch engine's ``optimizer.pt`` and ``reference.pt``, verl's
``optimizer.pt`` and ``reference.safetensors``); a unit test holds them to the backends' constants,
since the researcher may not import the engines.
"""

from __future__ import annotations

import logging
from pathlib import Path

__all__ = ["TRAINING_STATE_FILES", "shed_training_state"]

log = logging.getLogger(__name__)

TRAINING_STATE_FILES = ("optimizer.pt", "reference.pt", "reference.safetensors")


def shed_training_state(state_dir: Path) -> int:
    """Delete the training state from every checkpoint under a server's ``state_dir``
    (``checkpoints/step-<N>/weights/``); returns the bytes freed. Never raises: a file that cannot be
    removed stays, with a warning, because the run's ending matters more than the space."""
    freed = 0
    for path in sorted(state_dir.glob("checkpoints/step-*/weights/*")):
        if path.name not in TRAINING_STATE_FILES or not path.is_file():
            continue
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError as exc:
            log.warning("could not remove %s from an ended run: %s", path, exc)
            continue
        freed += size
    if freed:
        log.info("an ended run's checkpoints under %s shed %.1f MB of training state", state_dir, freed / 2**20)
    return freed
