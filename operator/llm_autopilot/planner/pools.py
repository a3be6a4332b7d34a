"""Choosing among the cluster's GPU pools (nodes grouped by GPU product). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.planner.config import ServingConfig
from llm_autopilot.planner.plan import Infeasible, Plan, PlanRequest, PlanResult
from llm_autopilot.planner.search import plan


@dataclass(frozen=True)
class GPUPool:
    """Nodes with the same GPU: what one replica can get on one node of them."""

    gpu: GPUSpec
    gpus_per_node: int
    #: GPU Feature Discovery ``nvidia.com/gpu.product`` values of these nodes
    products: tuple[str, ...]
    nodes: int = 1


@dataclass(frozen=True)
class PoolChoice:
    pool: GPUPool | None
    result: PlanResult


def replicas_that_fit(config: ServingConfig, pool: GPUPool) -> int:
    """How many replicas of this configuration the pool's nodes hold at once: each node takes as many pods as
    its GPUs allow, and a replica across nodes needs one pod per stage."""
    pods_per_node = pool.gpus_per_node // config.gpus_per_pod
    return pool.nodes * pods_per_node // config.nodes


def group_pools(nodes: Iterable[tuple[GPUSpec, str, int]]) -> list[GPUPool]:
    """(gpu, product label, allocatable GPUs) per node -> pools, one per catalog GPU."""
    by_name: dict[str, GPUPool] = {}
    for gpu, product, count in nodes:
        if count < 1:
            continue
        known = by_name.get(gpu.name)
        if known is None:
            by_name[gpu.name] = GPUPool(gpu, count, (product,), 1)
        else:
            products = tuple(sorted({*known.products, product}))
            by_name[gpu.name] = GPUPool(gpu, max(known.gpus_per_node, count), products, known.nodes + 1)
    return sorted(by_name.values(), key=lambda p: p.gpu.memory_mib)


def choose_pool(pools: list[GPUPool], request_for: Callable[[GPUPool], PlanRequest]) -> PoolChoice:
    """The feasible plan with the least GPU memory in total (GPUs x memory), then the fewest GPUs; a plan on one
    node before one across nodes (whose pipeline stages talk over the network)."""
    if not pools:
        return PoolChoice(None, Infeasible("no schedulable nodes with NVIDIA GPUs (nvidia.com/gpu.product label "
                                           "and allocatable nvidia.com/gpu) were found; name spec.gpu.product"))
    feasible: list[tuple[bool, int, int, GPUPool, Plan]] = []
    failures = []
    for pool in pools:
        result = plan(request_for(pool))
        if isinstance(result, Plan):
            gpus = result.config.num_gpus
            feasible.append((result.config.nodes > 1, gpus * pool.gpu.memory_mib, gpus, pool, result))
        else:
            failures.append(f"{pool.gpu.display_name} ({pool.gpus_per_node} per node): {result.message}")
    if feasible:
        *_, pool, best = min(feasible, key=lambda f: (f[0], f[1], f[2]))
        return PoolChoice(pool, best)
    if len(pools) == 1 and not pools[0].nodes:  # the spec's own GPU, on no node yet: no pool of the cluster tried
        return PoolChoice(None, result)
    return PoolChoice(None, Infeasible("does not fit on any GPU pool in the cluster: " + " | ".join(failures)))
