"""A data file as a study: the same ``tasks(seed)``, ``heldout()``, ``workflow`` and ``setup`` a
study client module defines, built from rows, so ``swarm run --data FILE`` (or a dataset folder or
name, ``_source``) goes through the very loop, held-out evaluation, seeds and progress that
``swarm run CLIENT.py`` has.

- ``tasks(seed)``: the training rows, ``epochs`` passes, each pass shuffled by ``(seed, pass)``.
- ``heldout()``: the rows of ``--heldout FILE`` (or dataset), or the rows whose stable hash (sha256 of prompt and
  ground truth) falls below ``--heldout-fraction`` (the same split on every run and machine, never
  trained on); at most ``heldout_size`` of them (the lowest hashes), since every evaluation round
  claims one episode per held-out task.
- ``workflow``: one chat call with the row's messages (the server's ``max_tokens`` and
  ``temperature``), scored by the reward; or the user's ``--workflow PATH:FUNC``, ``FUNC(ep, task)``
  returning the final text (scored by the reward), a number (the reward) or nothing (it called
  ``ep.finish``).
- ``setup``: with ``warmup_steps``, a supervised warm-up on the rows' reference answers (``answer``,
  else ``extra_info.answer``) on a fresh server only (policy version 0), as the digits example does.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swarm.data._reward import PROBE_ROWS, Reward, _user_function, as_reward, load_reward, probe
from swarm.data._rows import DataError, DataTask, Row, RowKeys
from swarm.data._source import dataset_source, read_rows

log = logging.getLogger(__name__)

DEFAULT_HELDOUT_SIZE = 64
WARMUP_BATCH = 16


@dataclass(frozen=True)
class DataOptions:
    """What ``swarm run --data`` was given (validated where the study is built)."""

    data: Path | str                  # a file, a dataset folder ([:split]) or org/name[:config][:split]
    reward: str = "verl"
    heldout: Path | str | None = None
    heldout_fraction: float | None = None
    heldout_size: int = DEFAULT_HELDOUT_SIZE
    epochs: int = 1
    workflow: str | None = None
    warmup_steps: int = 0
    warmup_lr: float = 3e-3
    group_size: int = 8
    concurrency: int = 16
    eval_every: int = 5
    prompt_key: str = "prompt"        # RowKeys: the column holding the prompt
    answer_key: str | None = None     # the column holding the answer (None: verl's reward_model, else answer)

    @property
    def keys(self) -> RowKeys:
        return RowKeys(self.prompt_key, self.answer_key)


class DataStudy:
    """Module-like: ``run_study`` and the probe read its attributes as they read a client module's."""

    def __init__(self, options: DataOptions, train: list[Row], held: list[Row], reward: Reward,
                 agent: Any = None) -> None:
        self.options, self.train, self.held, self.reward, self.agent = options, train, held, reward, agent
        self.GROUP_SIZE = options.group_size
        self.CONCURRENCY = options.concurrency
        self.EVAL_EVERY = options.eval_every
        self.name = _stem(str(options.data))

    def tasks(self, seed: int) -> Iterator[DataTask]:
        for epoch in range(self.options.epochs):
            order = list(range(len(self.train)))
            random.Random(f"{seed}:{epoch}").shuffle(order)
            for index in order:
                row = self.train[index]
                yield row.task(f"{self.name}-{row.number}-e{epoch}")

    def heldout(self) -> list[DataTask]:
        stems = {file: _stem(file) for file in {row.file for row in self.held}}
        return [row.task(f"{self.name}-heldout-{stems[row.file]}-{row.number}") for row in self.held]

    def workflow(self, ep: Any, task: DataTask) -> float | None:
        if self.agent is not None:
            result = self.agent(ep, task)
            if result is None or ep.done:
                return None if ep.done else result
            if not isinstance(result, str):
                return as_reward(result)
            text = result
        else:
            reply = ep.openai().chat.completions.create(model="policy", messages=task["prompt"])
            text = reply.choices[0].message.content or ""
        return as_reward(self.reward(text, task))

    def setup(self, client: Any) -> None:
        steps = self.options.warmup_steps
        if steps <= 0:
            return
        if client.status().policy_version > 0:
            log.info("server already trained (policy version > 0): skipping the warm-up")
            return
        examples = [{"messages": row.messages, "completion": row.answer} for row in self.train if row.answer]
        result = client.sft(examples, steps=steps, batch_size=WARMUP_BATCH, lr=self.options.warmup_lr)
        log.info("warm-up on %d rows' answers: %d steps, loss %.3f -> %.3f", len(examples), result.steps,
                 result.loss_first, result.loss_last)


def _stem(spec: str) -> str:
    source = dataset_source(spec)
    return Path(spec).stem if source is None else source.stem


def _split(rows: list[Row], fraction: float) -> tuple[list[Row], list[Row]]:
    train: list[Row] = []
    held: list[Row] = []
    for row in rows:
        (held if int(row.key()[:12], 16) / 16**12 < fraction else train).append(row)
    return train, held


def build_study(options: DataOptions) -> DataStudy:
    """Read, split and check the data and its reward; ``DataError``/``ValueError`` before anything runs."""
    options = replace(options, data=str(options.data),  # a name is no path: compare and show it as given
                      heldout=None if options.heldout is None else str(options.heldout))
    if options.epochs < 1:
        raise ValueError(f"--epochs must be >= 1, got {options.epochs}")
    if options.heldout is not None and options.heldout_fraction is not None:
        raise ValueError("give --heldout FILE or --heldout-fraction F, not both")
    if options.heldout_fraction is not None and not 0 < options.heldout_fraction < 1:
        raise ValueError(f"--heldout-fraction must be between 0 and 1, got {options.heldout_fraction}")
    rows = read_rows(options.data, options.keys)
    if options.heldout is not None:
        train, held = rows, read_rows(options.heldout, options.keys)
    elif options.heldout_fraction is not None:
        train, held = _split(rows, options.heldout_fraction)
        if not train or not held:
            raise DataError(options.data, None, f"--heldout-fraction {options.heldout_fraction} leaves "
                                                f"{len(train)} training and {len(held)} held-out rows")
    else:
        train, held = rows, []
    if options.heldout_size > 0 and len(held) > options.heldout_size:
        held = sorted(held, key=Row.key)[:options.heldout_size]
    if options.warmup_steps > 0 and not any(row.answer for row in train):
        raise DataError(options.data, None, "--warmup-steps needs reference answers: no row has 'answer' or "
                                            "'extra_info.answer'")
    reward = load_reward(options.reward)
    probe(reward, train, PROBE_ROWS)
    probe(reward, held, PROBE_ROWS)
    agent = None
    if options.workflow is not None:
        path, sep, name = options.workflow.rpartition(":")
        if not sep or not path:
            raise ValueError(f"--workflow takes PATH:FUNC, got {options.workflow!r}")
        agent = _user_function(Path(path), name, "workflow")
    return DataStudy(options, train, held, reward, agent)
