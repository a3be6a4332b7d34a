"""Simulated GPU node pools: Nodes labelled as NVIDIA GPU Feature Discovery would label them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from .api import Api
from .components import KWOK_NODE_ANNOTATION
from .kubelet import NODE_COUNT, POOL
from .paths import ClusterError
from .process import wait_for
from .state import Cluster

POOL_LABEL = "llm-autopilot.io/node-pool"


@dataclasses.dataclass(frozen=True)
class GpuPool:
    """A pool of identical fake GPU nodes, labelled like NVIDIA GFD would."""

    name: str
    count: int
    instance_type: str
    gpu_product: str  # nvidia.com/gpu.product (GFD-sanitised NVML name)
    gpu_memory_mib: int
    gpu_family: str
    compute: tuple[int, int]
    gpus: int
    cpu: int
    memory: str
    driver: str = "550.127.05"
    cuda: str = "12.4"


GPU_POOLS: tuple[GpuPool, ...] = (
    GpuPool(
        "h100",
        2,
        "gpu-8x-h100-80gb",
        "NVIDIA-H100-80GB-HBM3",
        81559,
        "hopper",
        (9, 0),
        gpus=8,
        cpu=208,
        memory="1843Gi",
    ),
    GpuPool(
        "a100",
        2,
        "gpu-8x-a100-40gb",
        "NVIDIA-A100-SXM4-40GB",
        40960,
        "ampere",
        (8, 0),
        gpus=8,
        cpu=96,
        memory="1152Gi",
    ),
    GpuPool("l4", 4, "gpu-1x-l4", "NVIDIA-L4", 23034, "ada-lovelace", (8, 9), gpus=1, cpu=48, memory="192Gi"),
)


def node_manifests() -> Iterator[dict[str, Any]]:
    for pool in GPU_POOLS:
        for i in range(pool.count):
            name = f"gpu-{pool.name}-{i}"
            driver_major, driver_minor, driver_rev = pool.driver.split(".")
            cuda_major, cuda_minor = pool.cuda.split(".")
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": pool.instance_type,
                "type": "kwok",
                POOL_LABEL: pool.name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": pool.gpu_product,
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                "nvidia.com/gpu.count": str(pool.gpus),
                "nvidia.com/gpu.family": pool.gpu_family,
                "nvidia.com/gpu.compute.major": str(pool.compute[0]),
                "nvidia.com/gpu.compute.minor": str(pool.compute[1]),
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.mode": "compute",
                "nvidia.com/cuda.driver-version.major": driver_major,
                "nvidia.com/cuda.driver-version.minor": driver_minor,
                "nvidia.com/cuda.driver-version.revision": driver_rev,
                "nvidia.com/cuda.driver-version.full": pool.driver,
                "nvidia.com/cuda.runtime-version.major": cuda_major,
                "nvidia.com/cuda.runtime-version.minor": cuda_minor,
                "nvidia.com/cuda.runtime-version.full": pool.cuda,
            }
            capacity = {
                "cpu": str(pool.cpu),
                "memory": pool.memory,
                "ephemeral-storage": "3500Gi",
                "pods": "110",
                "nvidia.com/gpu": str(pool.gpus),
            }
            allocatable = dict(capacity, cpu=f"{pool.cpu * 1000 - 500}m")
            yield {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"taints": [{"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": allocatable},
            }


def node_ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions", [])
    )


def process_nodes_registered(api: Api) -> bool:
    """The process kubelet's nodes exist and report a Ready condition (True, or False saying why)."""
    code, nodes = api.request("GET", f"/api/v1/nodes?labelSelector={POOL_LABEL}%3D{POOL}")
    items = nodes.get("items", []) if code == 200 else []
    return len(items) >= NODE_COUNT and all(
        any(c.get("type") == "Ready" for c in (n.get("status") or {}).get("conditions") or []) for n in items)


def create_nodes(api: Api) -> None:
    manifests = list(node_manifests())
    for manifest in manifests:
        code, body = api.request("POST", "/api/v1/nodes", manifest)
        if code not in (201, 409):
            raise ClusterError(f"creating node {manifest['metadata']['name']}: {code} {body}")

    def all_ready() -> bool:
        code, nodes = api.request("GET", f"/api/v1/nodes?labelSelector={POOL_LABEL}")
        items = nodes.get("items", []) if code == 200 else []
        return len(items) >= len(manifests) and all(node_ready(n) for n in items)

    wait_for(f"{len(manifests)} GPU nodes Ready", all_ready, 120)


def nodes(print_only: bool) -> None:
    if print_only:
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(node_manifests())}, indent=2))
        return
    create_nodes(Api(Cluster.load()))
