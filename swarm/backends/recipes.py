"""Named recipes: one word for a published algorithm that is a combination of ``TrainConfig`` keys.

A recipe is not a new algorithm: it sets keys that exist anyway, so a config file, a flag, a live
patch or the researcher's catalog can say ``recipe = "dr_grpo"`` instead of spelling out the
combination (and cannot get half of it). The rules, applied once where a config is validated:

- a recipe fills its keys wherever the same input leaves them unset;
- a key set in the same input to a value the recipe does not give is an error naming both (turn the
  recipe off with ``recipe = "none"`` to change one of its keys);
- ``"none"`` (the default) sets and checks nothing.

Recipes:

``dr_grpo``
    Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): GRPO without its two length
    and difficulty biases. ``norm_adv_by_std = false`` drops the division by the group's reward
    std; ``loss_agg_mode = "seq-mean-token-sum-norm"`` sums each sequence's token losses and divides
    by a constant (the batch's horizon) rather than the sequence's own length, so long wrong answers
    are no longer penalised less per token. The same two keys verl's documentation gives for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["RECIPES", "RECIPE_HELP", "Recipe", "check_recipe", "fill_recipe", "recipe_keys"]

Recipe = Literal["none", "dr_grpo"]
RECIPE_HELP = ("a named combination of loss keys: dr_grpo (norm_adv_by_std=false, "
               "loss_agg_mode=seq-mean-token-sum-norm); none: the keys as set")

RECIPES: dict[str, dict[str, Any]] = {
    "none": {},
    "dr_grpo": {"norm_adv_by_std": False, "loss_agg_mode": "seq-mean-token-sum-norm"},
}


def recipe_keys(name: object) -> frozenset[str]:
    """The keys recipe ``name`` sets (none for an unknown name: the field's own validation refuses it)."""
    return frozenset(RECIPES.get(str(name), {}))


def fill_recipe(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the keys of its recipe filled in where it leaves them unset."""
    keys = RECIPES.get(str(data.get("recipe", "none")), {})
    missing = {key: value for key, value in keys.items() if key not in data}
    return {**data, **missing} if missing else data


def check_recipe(name: str, values: Mapping[str, Any]) -> None:
    """``ValueError`` naming the first key in ``values`` that contradicts recipe ``name``."""
    for key, wanted in RECIPES.get(name, {}).items():
        if key in values and values[key] != wanted:
            raise ValueError(f"recipe {name!r} sets {key}={wanted!r}, not {values[key]!r}; set recipe='none' "
                             "to choose the keys yourself")
