"""``studies/replications/grpo.toml``, the published GRPO claims a campaign replicates: it parses, and the
offline planner frames each claim onto the knob the paper is about, judged on the metric the claim names."""

from __future__ import annotations

from pathlib import Path

from researcher.campaign import spec
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "studies" / "examples"

# The knob and metric each claim is about, in the file's order.
EXPECTED = [
    ("kl_coef", "train/reward_mean"),                      # KL penalty
    ("clip_ratio_high", "train/entropy"),                  # DAPO clip-higher
    ("batch_mode", "train/reward_mean"),                   # DAPO dynamic sampling
    ("group_size", "train/reward_mean"),                   # 2-GRPO
    ("recipe", "train/response_length_neg_mean"),          # Dr. GRPO
    ("random_reward", "train/reward_mean"),                # spurious rewards (negative control)
    ("lr", "train/reward_mean"),                           # positive control
    ("lr", "train/reward_mean"),                           # A/A
]


def test_every_published_claim_frames_onto_its_knob_and_metric() -> None:
    campaign, _ = spec.load(ROOT / "studies" / "replications" / "grpo.toml")
    assert len(campaign.claim) >= 6 and all(claim.source for claim in campaign.claim)
    planner = OfflinePlanner(sorted(catalog.examples(EXAMPLES)))
    framed = [planner.frame(claim.topic, catalog.describe(EXAMPLES)).value for claim in campaign.claim]
    assert [(f.knob, f.metric) for f in framed] == EXPECTED
    spurious = campaign.claim[5]
    assert spurious.model == "smollm2-135m" and spurious.expect == "yes" and "2506.10947" in spurious.source
