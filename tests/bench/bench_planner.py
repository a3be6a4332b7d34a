"""Planner latency: one plan for every catalog model on every catalog GPU, repeated.

Prints figures (goal: p50 < 5 ms per plan); it asserts nothing. Run with `make bench`.
"""

from __future__ import annotations

import statistics
import sys
import time

from llm_autopilot.catalog.gpus import GPUS
from llm_autopilot.catalog.models import catalog_models
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, behaviour_of

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def main() -> None:
    vllm = behaviour_of(DEFAULT_VLLM_VERSION)
    requests = [PlanRequest(m, g, vllm, Targets()) for m in catalog_models() for g in GPUS]
    for r in requests:  # warm-up (imports, caches)
        plan(r)
    samples: list[float] = []
    worst: tuple[float, str] = (0.0, "")
    feasible = 0
    for r in requests:
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            result = plan(r)
            times.append(time.perf_counter() - start)
        feasible += isinstance(result, Plan)
        samples += times
        median = statistics.median(times)
        if median > worst[0]:
            worst = (median, f"{r.model.model_id} on {r.gpu.name}")
    ms = sorted(s * 1000 for s in samples)
    quantile = statistics.quantiles(ms, n=100)
    print(f"plans: {len(requests)} model x GPU pairs ({feasible} feasible) x {REPEATS} repeats = {len(ms)}")
    print(f"latency ms: p50 {quantile[49]:.3f}  p95 {quantile[94]:.3f}  p99 {quantile[98]:.3f}  max {ms[-1]:.3f}")
    print(f"slowest pair (median): {worst[1]} {worst[0] * 1000:.3f} ms")
    print(f"goal p50 < 5 ms: {'met' if quantile[49] < 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
