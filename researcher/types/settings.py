"""Settings of one researcher process, validated once and passed down: the planner's LLM, a study's
options (stored in study.toml and the graph state) and where studies live.

Nothing here reads the environment: the composition root (``researcher.session.composition.build_settings``)
is the one place that builds ``ResearcherSettings`` from the CLI's flags and the environment, so tests
construct settings with tmp dirs and explicit values.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, JsonValue


class LLMSettings(BaseModel):
    """An OpenAI-compatible endpoint for the planner; absent means the offline planner."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str
    api_key: str = "not-needed"
    timeout_s: float = Field(120.0, gt=0, description="one request's limit, cut to what the study's deadline leaves")
    max_retries: int = Field(3, ge=0, le=10, description="retries of transient errors only (connection, timeout, "
                             "429, 5xx), each only where it fits before the study's deadline")
    # Cost accounting: USD per million tokens (0 = free / unknown).
    price_in_per_mtok: float = Field(0.0, ge=0)
    price_out_per_mtok: float = Field(0.0, ge=0)


class StudyOptions(BaseModel):
    """Per-study knobs that size the experiments; stored in study.toml and in the graph state."""

    model_config = ConfigDict(extra="forbid")

    steps_per_run: int = Field(30, ge=1, le=100_000, description="training steps each run trains for")
    seeds: int = Field(3, ge=1, le=16, description="seeds per configuration (3: t-intervals with n=2 are very wide)")
    seed_base: int = Field(0, ge=0, le=1_000_000, description="added to every run's seed (iteration i, seed k: "
                           "seed_base + i*1000 + k): a rerun of a study on fresh seeds")
    max_runs: int = Field(16, ge=1, description="training runs the whole study may launch")
    max_iterations: int = Field(3, ge=1, le=50, description="looks at the data, registered before the first run: "
                                "the pilot, then each added batch of seeds")
    max_repairs: int = Field(3, ge=0, le=20, description="validate/repair rounds before giving up")
    max_llm_tokens: int = Field(2_000_000, ge=0)
    max_llm_cost_usd: float = Field(5.0, ge=0)
    # Two runs at a time on 2 cores, one torch thread each: a tiny-model run is latency-bound (HTTP
    # round trips, Python overhead, sync-mode drains) and leaves a core idle on its own, and two runs
    # overlap their 15-30 s server start-ups. Configurations are compared per training step, and the
    # example studies train in sync mode (on-policy whatever the speed), so the contention that slows
    # each run's wall time does not bias the comparison.
    parallel_runs: int = Field(2, ge=1, le=16, validation_alias=AliasChoices("parallel_runs", "max_parallel_runs"),
                               description="at most this many training runs alive at once (max_parallel_runs): a "
                               "cap; runs also wait until the machine or cluster has the resources they ask for")
    gpus_per_run: float | None = Field(None, ge=0, description="GPUs each run asks for (0.5: two runs share one "
                                       "device); None: 1 on a machine or cluster with GPUs, else 0")
    run_resources: dict[str, float] | None = Field(None, description="resources each run asks for, Ray's "
                                            "names ({\"GPU\": 1, \"node_b\": 1}); these win over the derived ones")
    ray_address: str | None = Field(None, description="place runs on this Ray cluster (HOST:PORT, the GCS address "
                                    "`ray start --head` prints | auto | ray://HOST:PORT | http://HOST:8265); None: "
                                    "local processes")
    smoke_episodes: int = Field(4, ge=1, le=64)
    smoke_timeout_s: float = Field(60.0, gt=0)
    stall_timeout_s: float = Field(120.0, gt=0, description="no new training step for this long = stalled")
    poll_interval_s: float = Field(1.0, gt=0)
    max_client_restarts: int = Field(3, ge=0, description="restart a failed client this many times in a row "
                                     "(a training step between failures starts the count again); then the run crashed")
    client_stuck_s: float = Field(600.0, gt=0, description="no finished episode for this long while the server "
                                  "waits = a hung client (restarted)")
    min_free_disk_mb: float = Field(500.0, ge=0, description="park the study when the artifacts disk has less free")
    keep_training_state: bool = Field(False, description="keep an ended run's optimizer state and KL reference in "
                                      "its checkpoints; default: only the weights stay (an ended run is never "
                                      "resumed; researcher.runs.shedding)")
    model: str | None = Field(None, description="what `swarm serve --model` loads for every run; None: each "
                              "experiment's config.toml decides (its `model` key, else the server's default, tiny)")
    couple: bool = Field(True, description="paired arms share their tasks and sampling noise (swarm serve "
                         "--coupled) where every arm runs the torch engine and the arms differ "
                         "(researcher.study.coupling)")
    eval_samples: int | None = Field(None, ge=1, le=64, description="each held-out task's episodes a round "
                                     "(`swarm run --eval-samples`); None: the study client's EVAL_SAMPLES, else 1. "
                                     "With 2 or more every run logs eval/reward_mean_sd, one round's sampling noise")
    min_effect: float = Field(0.02, ge=0, description="the smallest AUC difference that matters: smaller resolved "
                              "differences are no Yes/No, and the pilot sizes the study to resolve ±min_effect")
    # A campaign's study (researcher.campaign): it parks after each look, so the campaign decides which
    # hypothesis gets the next seeds, and its arms start from the task's settled findings.
    park_after_look: bool = Field(False, description="park after each look that does not conclude (a campaign "
                                  "resumes the study when it gives it the next seeds)")
    baseline: dict[str, JsonValue] | None = Field(None, description="config keys every arm starts from (a "
                                                  "campaign's settled findings on the task); an arm's own "
                                                  "overrides win")
    design: dict[str, JsonValue] | None = Field(None, description="the arms the study runs, given instead of "
                                                "planned (``researcher.planner.designed.Design``: a discovery "
                                                "campaign's stage)")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="the study's two-sided false-positive rate over all its "
                         "looks (a discovery campaign gives each confirmation its share of one error budget)")
    # The user's data task (`researcher start --data`): studied instead of the example tasks.
    data: str | None = Field(None, description="absolute path of the training data file (jsonl or parquet)")
    data_sha256: str | None = Field(None, description="sha256 of the data file's content when the study started")
    heldout: str | None = Field(None, description="absolute path of the held-out file; None: a fixed fraction")
    heldout_sha256: str | None = None
    reward: str = Field("verl", description="what `swarm run --reward` takes: verl, exact, a data_source, PATH:FUNC")
    warmup_steps: int = Field(0, ge=0, description="supervised warm-up steps on the rows' answers, per fresh server")
    data_name: str | None = Field(None, description="the dataset folder or Hugging Face name --data gave; `data` "
                                  "is then the study's parquet snapshot of its rows")
    heldout_name: str | None = Field(None, description="the same for --heldout")
    prompt_key: str = Field("prompt", description="the data's prompt column (`swarm run --prompt-key`)")
    answer_key: str | None = Field(None, description="the data's answer column (`swarm run --answer-key`); None: "
                                   "reward_model.ground_truth, else answer")
    allow_unboxed: bool = Field(False, description="run LLM-written study code even where the OS sandbox (`swarm "
                                "run --box`) cannot be built: only the static check, a clean environment and "
                                "limits then (`researcher start --allow-unboxed`; the report says so)")


class ResearcherSettings(BaseModel):
    """Where studies live, how servers are started, and which planner to use."""

    model_config = ConfigDict(extra="forbid")

    studies_root: Path = Path("studies")
    artifacts_root: Path = Path("artifacts")
    examples_root: Path = Path("studies/examples")
    prompts_root: Path = Path("prompts")
    tracking_uri: str | None = Field(None, description="MLflow URI; default sqlite:///<artifacts>/mlflow.db")
    # How to start `swarm …` as a process; a list so tests can point it at any interpreter.
    swarm_command: list[str] = Field(default_factory=lambda: [sys.executable, "-c",
                                                              "from swarm.cli import main; main()"])
    servers: list[str] = Field(default_factory=list, description="existing swarm servers to use instead")
    server_token: str | None = None
    llm: LLMSettings | None = None
    # Size caps, so a study left for days keeps bounded logs (researcher.runs.logs, researcher.study.events).
    log_max_mb: float = Field(64.0, gt=0, description="a run's server.log or client.log beyond this is copied to "
                              "<log>.1 and truncated (older copies shift up to log_keep)")
    log_keep: int = Field(2, ge=0, le=100, description="rotated copies kept of each run log and of events.jsonl")
    events_max_mb: float = Field(32.0, gt=0, description="a study's events.jsonl beyond this rotates to "
                                 "events.jsonl.1; event ids go on")

    def resolved(self) -> ResearcherSettings:
        """A copy with absolute paths, so child processes and MLflow URIs do not depend on cwd."""
        return self.model_copy(update={
            "studies_root": self.studies_root.resolve(),
            "artifacts_root": self.artifacts_root.resolve(),
            "examples_root": self.examples_root.resolve(),
            "prompts_root": self.prompts_root.resolve(),
        })

    def mlflow_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{self.artifacts_root.resolve() / 'mlflow.db'}"

    def mlflow_artifact_root(self) -> Path:
        return self.artifacts_root.resolve() / "mlartifacts"
