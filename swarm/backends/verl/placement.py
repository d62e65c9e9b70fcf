"""Where verl's workers go: one placement group per node, sized by the node's free devices.

verl's ``RayResourcePool(process_on_nodes=[n, m, ...])`` builds one ``STRICT_PACK`` placement group
per list entry, and a ``STRICT_PACK`` group must fit on a single node. Asking for
``process_on_nodes=[8]`` on two 4-GPU nodes passes a cluster-wide free-GPU check and then waits
forever in ``pg.ready()``. ``plan_nodes`` splits the workers over the nodes' free devices instead
(most free first, so a job that fits one node stays on one node), and ``resource_pool`` builds the
pool from that plan; neither starts anything, so both are tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["free_per_node", "plan_nodes", "resource_pool"]


def plan_nodes(workers: int, free: Sequence[float]) -> list[int]:
    """Workers per placement group: fill the nodes with the most free devices first.

    ``free``: whole free devices (GPUs, or CPUs on the CPU platform) per alive node. ``ValueError``
    naming what is missing when the nodes cannot hold ``workers`` one device each.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    slots = sorted((int(f + 1e-6) for f in free if f + 1e-6 >= 1), reverse=True)  # Ray reports floats
    plan: list[int] = []
    left = workers
    for slot in slots:
        if left == 0:
            break
        take = min(slot, left)
        plan.append(take)
        left -= take
    if left:
        raise ValueError(f"{workers} verl workers need one device each, but the Ray nodes have "
                         f"{sum(slots)} free ({', '.join(map(str, slots)) or 'none'} per node)")
    return plan


def free_per_node(resource: str) -> list[float]:
    """Free ``resource`` ("GPU" or "CPU") per alive node of the connected Ray cluster."""
    from ray._private.state import available_resources_per_node  # Ray's DeveloperAPI; ray.state is deprecated

    per_node: dict[str, dict[str, float]] = available_resources_per_node()
    return [float(resources.get(resource, 0.0)) for resources in per_node.values()]


def resource_pool(plan: Sequence[int], *, use_gpu: bool) -> Any:
    """verl's ``RayResourcePool`` with one placement group per ``plan`` entry, one device a worker."""
    from verl.single_controller.ray import RayResourcePool

    # max_colocate_count=1: verl's default (10) asks for 10 CPUs per bundle.
    return RayResourcePool(process_on_nodes=list(plan), use_gpu=use_gpu, max_colocate_count=1)
