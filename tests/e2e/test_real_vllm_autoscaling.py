"""KEDA scaling a real vLLM (the CPU build on the vllm-cpu pool) on its own /metrics, as Prometheus scrapes them:
real overload queues requests -> a second replica on the pool's second node; the load stops -> back to one."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    MIB,
    START_SECONDS,
    FollowingLoad,
    apply,
    complete,
    kv_room_fixture,  # noqa: F401 - a fixture
    llmd,
    operator_for,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]
NAME = "scaled"
#: HPA sync (15 s) + KEDA polling + scrapes + the operator + the second vLLM's start-up
SCALE_SECONDS = 60 + START_SECONDS


def spec_replicas(kubectl: Kubectl, namespace: str) -> int:
    return int(llmd(kubectl, namespace, NAME)["spec"].get("replicas", 0))


def test_real_queueing_scales_out_to_the_second_node_and_back(
        kubectl: Kubectl, namespace: str, kv_room: Any, tmp_path: Path) -> None:
    kv_room(4 * MIB)  # 8,192 tokens: a few long requests fill it and the rest wait
    # a long scale-down window first: the HPA keeps 2 replicas through the calm after the load, until the window
    # is shortened below. The second vLLM starts under the load, on the other node's own CPUs
    policy = {"minReplicas": 1, "maxReplicas": 2, "targetKVCacheUsage": 0.9, "targetWaitingRequests": 2,
              "pollingIntervalSeconds": 2, "scaleDownStabilizationSeconds": 3600}
    with operator_for(kubectl, namespace, tmp_path):
        apply(kubectl, namespace, tiny(NAME, serving={"maxModelLen": 4096}, replicas=1,
                                       remediation={"enabled": False}, autoscaling=policy))
        wait_for("one Ready vLLM", lambda: len(ready_pods(kubectl, namespace, NAME)) == 1, timeout=START_SECONDS,
                 interval=2)
        load = FollowingLoad(kubectl, namespace, NAME, clients=12, prompt_tokens=1500, max_tokens=400)
        started = time.monotonic()
        try:
            def scaled_out() -> bool:
                load.refresh()
                return spec_replicas(kubectl, namespace) == 2
            wait_for("KEDA asking for a second replica", scaled_out, timeout=SCALE_SECONDS, interval=2)
            asked = time.monotonic() - started
            # KEDA may ask before the first long request is done (a pod's first requests also compile kernels for
            # new shapes): the load was served, not only queued, once a request of it completes
            wait_for("a request of the load answered", lambda: any(
                one.result.completed for one in load.loads.values()), timeout=SCALE_SECONDS, interval=2)

            def both_ready() -> bool:
                load.refresh()  # the load stays on, and follows the second pod once it is Ready
                return len(ready_pods(kubectl, namespace, NAME)) == 2

            wait_for("two Ready vLLMs", both_ready, timeout=SCALE_SECONDS, interval=2)
            serving = time.monotonic() - started
        finally:
            completed = load.stop()
        assert completed > 0
        pods = ready_pods(kubectl, namespace, NAME)
        assert len({p["spec"]["nodeName"] for p in pods}) == 2  # one simulated GPU per node: the second node
        for pod in pods:
            assert complete(pod)["usage"]["completion_tokens"] == 8
        assert spec_replicas(kubectl, namespace) == 2  # the long window holds the count through the calm
        apply(kubectl, namespace, tiny(NAME, serving={"maxModelLen": 4096}, replicas=2,
                                       remediation={"enabled": False},
                                       autoscaling={**policy, "scaleDownStabilizationSeconds": 5}))
        calm = time.monotonic()
        wait_for("KEDA scaling back to one", lambda: spec_replicas(kubectl, namespace) == 1, timeout=SCALE_SECONDS,
                 interval=2)
        scaled_in = time.monotonic() - calm
        wait_for("one vLLM left", lambda: len(ready_pods(kubectl, namespace, NAME)) == 1, timeout=120, interval=2)
        status: dict[str, Any] = llmd(kubectl, namespace, NAME)["status"]
        assert status["plan"]["replicasThatFit"] == 2
    sys.stderr.write(f"\n[real vLLM] KEDA: real queueing -> 2 replicas asked after {asked:.0f} s ({completed} "
                     f"completions), both serving after {serving:.0f} s; calm, window shortened -> 1 replica after "
                     f"{scaled_in:.0f} s\n")
