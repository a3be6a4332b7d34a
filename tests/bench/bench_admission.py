"""The admission review's own cost, in process: Operator.review (the webhook's whole answer but the HTTP) on a
catalog model, with the GPU nodes from a node index of 20 nodes as Kopf hands it over.

Prints p50/p99 in ms (the goal it serves: the webhook's p99 under 200 ms during a mass create of 1,000 objects,
measured end to end by `make bench-scale`); asserts nothing. Run with `make bench-admission` (N=500 reviews).
The index is already filled: the one LIST of the node view (controller/admission.py::NodeView) is answered by an
in-memory cluster of the same 20 nodes before the timed reviews.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, cast

import yaml

from llm_autopilot.controller import handlers
from llm_autopilot.controller.kube import Kube, NodeGPUs
from llm_autopilot.controller.runtime import Operator
from llm_autopilot.controller.settings import OperatorSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-l4.yaml"
L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034",
      "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"}
NODES = 20
USER = {"username": "alice", "groups": ["system:authenticated"]}


class Cluster:
    """What the node view's one LIST reads (kube.gpu_nodes()): the same nodes as the index."""

    def gpu_nodes(self) -> list[NodeGPUs]:
        return [NodeGPUs(dict(L4), 1, 120.0) for _ in range(NODES)]


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(L4)}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "1", "memory": "120Gi"}}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    operator = Operator(OperatorSettings.from_env(), cast(Kube, Cluster()))  # never reached once the index
    # holds the LIST's nodes
    index = {None: [asyncio.run(handlers.gpu_nodes(body=node(f"n{i}")))[None] for i in range(NODES)]}
    for i in range(20):  # warm-up: imports, the node view's LIST
        warnings, refusal, _ = operator.review(spec, f"warm{i}", USER, "ns", index)
        assert refusal is None, refusal
    took = []
    for i in range(count):
        started = time.perf_counter()
        operator.review(spec, f"q{i}", USER, "ns", index)
        took.append((time.perf_counter() - started) * 1000)
    lists = operator.node_view.lists
    print(f"Operator.review on {EXAMPLE.name} with a {NODES}-node index, {count} reviews: "
          f"p50 {percentile(took, 0.5):.2f} ms, p99 {percentile(took, 0.99):.2f} ms, max {max(took):.2f} ms; "
          f"node LISTs: {lists}; warnings: {warnings}")


if __name__ == "__main__":
    main()
