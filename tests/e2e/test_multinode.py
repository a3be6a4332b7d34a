"""Replicas across nodes on the local cluster's simulated H100 nodes: Llama-3.1-405B in bf16 as one StatefulSet
group of two pods (one per 8-GPU node), Ready as a unit; a worker's OOM counts against the group's plan; the
group verified per stage (its leader's vllm:cache_config_info from Prometheus); with the LeaderWorkerSet CRD
present, a LeaderWorkerSet the API server accepts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, Kubectl, Operator, wait_for
from tests.e2e.helpers import apply_example, condition, remediation, running_pods, wait_condition
from tests.e2e.metrics import VllmSimulator, forget_namespace, wait_for_series

pytestmark = pytest.mark.e2e
NAME = "llama-405b"
GROUP = f"{NAME}-0"
LWS_CRD = ROOT / "tests" / "data" / "crds" / "leaderworkersets.yaml"
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"


def sts_container(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return dict(kubectl.json("statefulset", GROUP, "-n", ns)["spec"]["template"]["spec"]["containers"][0])


def test_405b_runs_as_one_group_on_two_h100_nodes(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "llama-3.1-405b-multinode.yaml")
    llmd = wait_condition(kubectl, namespace, NAME, "Ready", "True", timeout=120)
    plan = llmd["status"]["plan"]
    assert plan["summary"] == "16 x H100-80GB (2 nodes)" and plan["quantization"] == "bf16"
    assert (plan["tensorParallelSize"], plan["pipelineParallelSize"], plan["nodes"]) == (8, 2, 2)
    assert [s["layers"] for s in plan["stages"]] == [63, 63] and plan["replicasThatFit"] == 1
    assert any(r.startswith("pipelineParallelSize=2: pipeline parallel across 2 nodes") for r in plan["reasons"])
    ready = condition(llmd, "Ready")
    assert ready is not None and ready["message"] == "1/1 replicas are available"  # the group counts once
    assert llmd["status"]["readyReplicas"] == 1 and llmd["status"]["replicas"] == 1

    sts = kubectl.json("statefulset", GROUP, "-n", namespace)
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["status"]["readyReplicas"] == 2
    headless = kubectl.json("service", GROUP, "-n", namespace)["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert kubectl.json("service", NAME, "-n", namespace)["spec"]["selector"]["apps.kubernetes.io/pod-index"] == "0"
    assert kubectl.maybe("deployment", NAME, "-n", namespace) is None
    # one pod per H100 node, each with its node's 8 GPUs; ranks from the ordinal
    pods = sorted(running_pods(kubectl, namespace, NAME), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == [f"{GROUP}-0", f"{GROUP}-1"]
    assert {p["spec"]["nodeName"] for p in pods} == {"gpu-h100-0", "gpu-h100-1"}
    assert [p["metadata"]["labels"]["apps.kubernetes.io/pod-index"] for p in pods] == ["0", "1"]
    c = pods[0]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    args = c["args"]
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--master-addr") + 1] == f"{GROUP}-0.{GROUP}"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    # the PodDisruptionBudget covers every pod of the group
    pdb = kubectl.json("pdb", NAME, "-n", namespace)
    assert pdb["spec"]["maxUnavailable"] == 1 and wait_for(
        "the PDB counting both pods", lambda: kubectl.json("pdb", NAME, "-n", namespace)["status"].get(
            "expectedPods") == 2, timeout=60)


def test_a_workers_oom_counts_against_the_groups_plan(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    apply_example(kubectl, namespace, "llama-3.1-405b-multinode.yaml")
    wait_condition(kubectl, namespace, NAME, "Ready", "True", timeout=120)
    before = sts_container(kubectl, namespace)["resources"]["limits"]["memory"]
    worker = next(p for p in running_pods(kubectl, namespace, NAME)
                  if p["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1")
    status = worker["status"]["containerStatuses"][0]
    stamp = "2026-12-01T00:00:05Z"
    status.update(restartCount=1, lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                             "startedAt": stamp, "finishedAt": stamp}})
    kubectl("patch", "pod", worker["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"containerStatuses": [status]}}))
    wait_for("a larger memory limit for every pod of the group",
             lambda: sts_container(kubectl, namespace)["resources"]["limits"]["memory"] != before, timeout=60)
    rem = wait_for("rung 1", lambda: (r := remediation(kubectl, namespace, NAME)).get("rung") == 1 and r, 30)
    assert rem["history"][-1]["signal"] == "OOMKilled"
    assert rem["history"][-1]["evidence"].get("pod") == worker["metadata"]["name"]


def test_a_group_is_verified_on_the_stage_that_bounds_its_kv_cache(
        kubectl: Kubectl, operator: Operator, namespace: str, prometheus_url: str, vllm_sim: VllmSimulator) -> None:
    """KWOK pods run no vLLM: the simulator plays the leader's /metrics (the engine's cache_config_info, which only
    rank 0 serves), Prometheus scrapes it, and the operator reads it as it would a real leader's. The workers of a
    simulated node have no log, so each stage's own room is said to be unread."""
    apply_example(kubectl, namespace, "llama-3.1-405b-multinode.yaml")
    llmd = wait_condition(kubectl, namespace, NAME, "Planned", "True", timeout=120)
    stages = llmd["status"]["plan"]["stages"]
    planned_blocks = min(s["kvCacheTokens"] for s in stages) // 16
    # the engine has 10 % fewer blocks than the plan: about 2.5 % of an H100's memory, past the 2 % tolerance
    blocks = planned_blocks * 9 // 10
    leader = f"{GROUP}-0"
    try:
        vllm_sim.set_pod(namespace, leader, model_name="llama-405b", vllm_version="0.33.0", num_gpu_blocks=blocks,
                         block_size=16)
        wait_for_series(prometheus_url, f'vllm:cache_config_info{{namespace="{namespace}",pod="{leader}"}}')
        # read once the group is Ready; a read before Prometheus had the series is retried on the next resync
        llmd = wait_for("PlanVerified judged on the leader's engine", lambda: (
            o if (c := condition(o := kubectl.json("llmd", NAME, "-n", namespace), "PlanVerified")) is not None
            and c["reason"] in ("WithinTolerance", "OutsideTolerance") else None), timeout=120)
    finally:
        forget_namespace(vllm_sim, namespace)
    verification = llmd["status"]["verification"]
    assert verification["source"] == "metrics" and verification["actualBlocks"] == blocks
    assert verification["predictedBlocks"] == planned_blocks and verification["errorPercent"] < -2
    assert [p["pod"] for p in verification["pods"]] == [leader]  # one engine per group, on its leader
    # each stage, with its pod; 63 + 63 layers: the plan's first stage bounds (equal stages, the first)
    assert [(s["pod"], s["stage"], s["predictedBlocks"]) for s in verification["stages"]] == [
        (f"{GROUP}-{i}", i, stages[i]["kvCacheTokens"] // 16) for i in (0, 1)]
    assert verification["boundStage"] == 0 and [s["bounds"] for s in verification["stages"]] == [True, False]
    assert all("errorPercent" not in s and s["problem"].startswith("log: ") for s in verification["stages"])
    verified = condition(llmd, "PlanVerified")
    assert verified is not None and (verified["status"], verified["reason"]) == ("False", "OutsideTolerance")
    assert f"{blocks * 16:,} tokens" in verified["message"]
    assert "stage 0 bounds the KV cache (vLLM gives every stage the blocks of the stage with the fewest) by the " \
           "plan: not every stage's room could be read" in verified["message"]
    described = kubectl("describe", "llmd", NAME, "-n", namespace).stdout
    assert "PlanNotVerified" in described and "Bound Stage" in described


@pytest.fixture
def lws_crd(kubectl: Kubectl) -> Iterator[None]:
    """The LeaderWorkerSet CRD, only for this test: its presence switches every operator to LWS objects."""
    kubectl("apply", "--server-side", "-f", str(LWS_CRD))
    try:  # deleted also when it never gets established
        wait_for("the LWS CRD established", lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            # read right after its create, the CRD had "conditions": null
            for c in (kubectl.json("crd", LWS_CRD_NAME).get("status") or {}).get("conditions") or []), timeout=30)
        yield
    finally:
        kubectl("delete", "crd", LWS_CRD_NAME, "--ignore-not-found", "--wait=true", check=False)


def _pod_from_template(template: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": template["metadata"]["labels"],
                         "annotations": template["metadata"].get("annotations", {})},
            "spec": template["spec"]}


def test_with_the_lws_crd_the_group_is_a_leader_worker_set(kubectl: Kubectl, operator: Operator, namespace: str,
                                                           lws_crd: None, tmp_path: Path) -> None:
    apply_example(kubectl, namespace, "llama-3.1-405b-multinode.yaml")
    wait_condition(kubectl, namespace, NAME, "Planned", "True", timeout=60)
    # the operator's own server-side dry run and write passed the CRD's schema; strict field validation too
    lws = wait_for("the LeaderWorkerSet", lambda: kubectl.maybe("lws", NAME, "-n", namespace), timeout=60)
    assert kubectl.maybe("statefulset", GROUP, "-n", namespace) is None
    template = lws["spec"]["leaderWorkerTemplate"]
    assert lws["spec"]["replicas"] == 1 and template["size"] == 2
    for key in ("leaderTemplate", "workerTemplate"):
        pod = _pod_from_template(template[key], f"{NAME}-{key.lower()}", namespace)
        manifest = tmp_path / f"{key}.json"
        manifest.write_text(json.dumps(pod))
        result = kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(manifest), check=False)
        assert result.returncode == 0, result.stderr
    clean = {k: v for k, v in lws.items() if k in ("apiVersion", "kind", "spec")}
    clean["metadata"] = {"name": f"{NAME}-copy", "namespace": namespace}
    copy = tmp_path / "lws.json"
    copy.write_text(json.dumps(clean))
    result = kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", str(copy), check=False)
    assert result.returncode == 0, result.stderr
    assert kubectl.json("service", NAME, "-n", namespace)["spec"]["selector"][
        "leaderworkerset.sigs.k8s.io/worker-index"] == "0"
