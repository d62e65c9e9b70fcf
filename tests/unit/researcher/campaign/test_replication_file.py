"""``studies/replications/grpo.toml``, the published GRPO claims a campaign replicates: it parses, and the
offline planner frames each claim onto the knob the paper is about, judged on the metric the claim names."""

from __future__ import annotations

from pathlib import Path

from researcher.campaign import runner, spec
from researcher.campaign.record import CampaignRecord, ClaimRecord
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from swarm.config import ServerConfig, read_config_file

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


def test_the_smollm2_claims_train_in_sync_mode_through_their_data_config(tmp_path: Path) -> None:
    """The SmolLM2 claims name a server config of their own (``data_config``), passed on as ``researcher start
    --data-config``: sync mode, so that their coupled arms sample alike (in async mode they part at once)."""
    campaign, _ = spec.load(ROOT / "studies" / "replications" / "grpo.toml")
    smollm2 = [i for i, claim in enumerate(campaign.claim) if claim.model == "smollm2-135m"]
    assert len(smollm2) == 2
    for index in smollm2:
        path = campaign.claim[index].data_config
        assert path is not None
        keys = read_config_file(ROOT / path).values
        keys.pop("eval_every")  # the study client's, not the server's
        assert ServerConfig(**keys).mode == "sync"
        rec = CampaignRecord(name="grpo", budget_s=3600, study_deadline=0,
                             claims=[ClaimRecord(index=index, study_id=f"grpo-c{index + 1}")])
        argv = runner._session_argv(campaign, rec, rec.claims[0], 600, tmp_path / "s", tmp_path / "a")
        assert argv[argv.index("--data-config") + 1] == path and argv[argv.index("--model") + 1] == "smollm2-135m"

