"""Every sampling option crosses the wire to a pool worker: a field added to ``SamplingParams`` but not to
``WireParams`` made every worker call a 400 (the grammar of constrained decoding did), and the pool's whole
traffic fell back to the server's own generator."""

from __future__ import annotations

from dataclasses import fields

from swarm.backends.base import SamplingParams
from swarm.pool.wire import WireParams


def test_every_sampling_option_round_trips_to_a_worker() -> None:
    assert {f.name for f in fields(SamplingParams)} == set(WireParams.model_fields)
    params = SamplingParams(max_tokens=4, temperature=0.7, stop=("x",), seed=3, stop_token_ids=(5,),
                            logit_bias=((7, -100.0),), noise_key=2**63, grammar='start: "a"')
    assert WireParams.of(params).sampling() == params
    assert WireParams.of(SamplingParams(max_tokens=2)).sampling() == SamplingParams(max_tokens=2)
