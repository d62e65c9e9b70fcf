"""Coupled arms: paired runs that share their tasks and their sampling noise (common random numbers).

Arms of one comparison run the same seeds, so they already draw the same tasks; with ``coupled = true``
(``swarm serve --coupled``) their servers also key every sampled token's noise by (seed, task, sample,
position), so two arms sample the same tokens wherever their policies agree, and their held-out rounds
evaluate the same problems with the same noise. What is left of a paired difference is then more the
configurations' effect and less the luck of the draw (``tests/bench/bench_coupling.py`` measures how much).

The researcher couples a study's arms by default (``StudyOptions.couple``) where it can:
- it starts the runs' servers (an existing server, ``--server``, keeps the noise mode it was started with);
- every arm runs the torch engine (vLLM draws its noise from its own per-request streams);
- no arm sets ``deterministic`` or ``coupled`` itself (its own choice wins);
- the arms are not identical: an A/A check keeps independent noise, because coupled identical arms
  would be identical by construction and the check would measure nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["couple", "describe"]

_OWN = ("deterministic", "coupled")


def couple(configs: Mapping[str, dict[str, Any]], enabled: bool) -> dict[str, dict[str, Any]]:
    """The experiments' server configs, with ``coupled = true`` where the arms can share their noise (the
    rules are in the module docstring; ``describe`` says which one applied)."""
    out = {name: dict(config) for name, config in configs.items()}
    if (enabled and _engines(configs) == {"torch"} and not any(k in c for c in configs.values() for k in _OWN)
            and not _identical(configs)):
        for config in out.values():
            config["coupled"] = True
    return out


def describe(configs: Mapping[str, Mapping[str, Any]]) -> str:
    """One sentence for the study's log and report: how the arms of these configs drew their noise."""
    if _identical(configs) and all(c.get("coupled") or c.get("deterministic") for c in configs.values()):
        return ("Arms are identical and share their sampling noise: they are identical by construction, so "
                "a difference between them measures nothing but float rounding.")
    if any(c.get("deterministic") for c in configs.values()):
        return "Arms ran in deterministic mode (keyed noise, rows decoded alone): paired arms shared their noise."
    if configs and all(c.get("coupled") for c in configs.values()):
        return ("Paired arms shared their tasks and sampling noise (coupled: the same seed samples the same "
                "tokens wherever the arms' policies agree).")
    if _identical(configs):
        return ("Arms ran with independent sampling noise: they are identical (an A/A check), and coupled "
                "they would be identical by construction.")
    if (others := _engines(configs) - {"torch"}):
        return (f"Arms ran with independent sampling noise: the {'/'.join(sorted(others))} engine draws its own "
                "noise, so only the torch engine can share it.")
    return "Arms ran with independent sampling noise (coupling off: --no-couple, or existing servers)."


def _engines(configs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {str(config.get("engine", "torch")) for config in configs.values()}


def _identical(configs: Mapping[str, Mapping[str, Any]]) -> bool:
    return len(configs) >= 2 and len({repr(sorted(c.items())) for c in configs.values()}) == 1
