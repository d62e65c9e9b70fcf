"""The RL maths the torch and verl trainers share: advantage estimators, policy losses and KL
penalties, looked up by name in verl's registries (``registry``), one function each.

Imported by the trainers only (``import verl`` happens on first use; torch on import).
"""

from swarm.algorithms.registry import (
    SUPPORTED_ESTIMATORS,
    AdvantageSettings,
    LossSettings,
    actor_config,
    aggregate,
    check_estimator,
    compute_advantages,
    kl_terms,
    policy_loss_fn,
    rollout_is_weights,
)

__all__ = [
    "SUPPORTED_ESTIMATORS",
    "AdvantageSettings",
    "LossSettings",
    "actor_config",
    "aggregate",
    "check_estimator",
    "compute_advantages",
    "kl_terms",
    "policy_loss_fn",
    "rollout_is_weights",
]
