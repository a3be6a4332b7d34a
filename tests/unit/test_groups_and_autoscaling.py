"""Replicas across nodes (StatefulSet groups, a LeaderWorkerSet), KEDA autoscaling and host memory: the
renderers, the reconcile on an in-memory cluster, and the ladder's autoscaled case."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from llm_autopilot.api.convert import gpu_pools, targets, targets_for_pool
from llm_autopilot.api.v1alpha1 import AUTO, LLMDeploymentSpec
from llm_autopilot.controller.admission import review
from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.pools import choose_pool
from llm_autopilot.planner.search import plan
from llm_autopilot.remediation.classify import Classification, Signal
from llm_autopilot.remediation.ladder import Overrides, Running, candidates
from llm_autopilot.render import groups
from llm_autopilot.render.autoscaling import KEDA_CRD, kv_usage_query, scaled_object
from llm_autopilot.render.host_memory import MM_PROCESSOR_CACHE_GIB, flag_value, host_memory
from llm_autopilot.render.kubernetes import INPUT_HASH, PLAN_HASH, Owner, WorkloadInputs, container_resources
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VLLMVersion, behaviour_of
from tests.conftest import gpu, model
from tests.unit.fakes import H100, L4, NAME, NAMESPACE, FakeCluster, Run
from tests.unit.test_remediation import running as remediation_running

OWNER = Owner(NAME, NAMESPACE, "uid")
PROM = "http://prometheus.test:9090"
V = str(DEFAULT_VLLM_VERSION)
LLAMA_405B = {"model": {"name": "meta-llama/Llama-3.1-405B"},
              "gpu": {"product": "nvidia-h100-80gb", "maxGPUs": 16}, "serving": {"maxModelLen": 32768}}


def two_h100_nodes(**kwargs: Any) -> FakeCluster:
    return FakeCluster(nodes=[NodeGPUs(dict(H100), 8, 1800.0), NodeGPUs(dict(H100), 8, 1800.0)], **kwargs)


def four_l4_nodes(keda: bool = True) -> FakeCluster:
    cluster = FakeCluster(nodes=[NodeGPUs(dict(L4), 1, 180.0) for _ in range(4)])
    if keda:
        cluster.objects[("CustomResourceDefinition", KEDA_CRD)] = {"metadata": {"name": KEDA_CRD}}
    return cluster


def objects_of(cluster: FakeCluster, kind: str) -> dict[str, dict[str, Any]]:
    return {name: obj for (k, name), obj in cluster.objects.items() if k == kind}


def group_inputs(spec: dict[str, Any] = LLAMA_405B, **kwargs: Any) -> WorkloadInputs:
    s = LLMDeploymentSpec.model_validate(spec)
    p = plan(PlanRequest(model(s.model.name), gpu("nvidia-h100-80gb"), behaviour_of(VLLMVersion(0, 33, 0)),
                         targets(s)))
    assert isinstance(p, Plan) and p.config.nodes == 2
    return WorkloadInputs(OWNER, s, p, ("meta-llama/Llama-3.1-405B", "--port", "8000"), "vllm/vllm-openai:v0.33.0",
                          ("NVIDIA-H100-80GB-HBM3",), **kwargs)


# --- the API ---------------------------------------------------------------------------------------------------


def test_max_model_len_takes_auto_or_a_number_and_nothing_else() -> None:
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, "serving": {"maxModelLen": "auto"}})
    assert spec.serving.max_model_len == AUTO and spec.serving.auto_max_model_len
    assert spec.serving.fixed_max_model_len is None
    for bad in ("automatic", 0, True, 1.5, "8192"):
        with pytest.raises(ValidationError, match="whole number of tokens from 1 to 1073741824, or auto"):
            LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, "serving": {"maxModelLen": bad}})
    # auto is not a number to compare the minimum with
    LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"},
                                      "serving": {"maxModelLen": "auto", "minMaxModelLen": 30000}})


def test_autoscaling_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.minReplicas \(3\) is larger than maxReplicas \(2\)"):
        LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"},
                                          "autoscaling": {"minReplicas": 3, "maxReplicas": 2}})
    with pytest.raises(ValidationError, match=r"remediation\.maxReplicas has no effect with autoscaling"):
        LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, "autoscaling": {"maxReplicas": 2},
                                          "remediation": {"maxReplicas": 3}})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"},
                                          "autoscaling": {"minReplicas": 0, "maxReplicas": 2}})


# --- renderers ---------------------------------------------------------------------------------------------------


def test_a_group_is_a_statefulset_of_one_pod_per_node_ranked_by_ordinal() -> None:
    inputs = group_inputs()
    sts = groups.statefulset(inputs, 0)
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    assert sts["metadata"]["name"] == "x-0" and spec["serviceName"] == "x-0"
    assert spec["replicas"] == 2 and spec["podManagementPolicy"] == "Parallel"
    c = pod["containers"][0]
    assert c["command"][:2] == ["/bin/sh", "-c"] and c["command"][3] == "vllm-serve"
    assert "--headless" in c["command"][2] and 'exec vllm serve "$@" --node-rank 0' in c["command"][2]
    args = c["args"]
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--master-addr") + 1] == "x-0-0.x-0"
    rank = next(e for e in c["env"] if e["name"] == groups.NODE_RANK_ENV)
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    # each pod holds one node's share of the GPUs
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # every rank asks the leader's /health: the group is ready as a unit
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "exec" in c[probe] and groups.LEADER_ENV in c[probe]["exec"]["command"][2]
    labels = sts["spec"]["template"]["metadata"]
    assert labels["labels"][groups.GROUP_LABEL] == "0" and PLAN_HASH in labels["annotations"]
    assert labels["labels"]["app.kubernetes.io/instance"] == NAME  # the gatherer finds workers too


def test_the_serve_script_passes_every_argument_through_untouched(tmp_path: Path) -> None:
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '<%s>' \"$a\"; done\n")
    fake.chmod(0o755)
    for rank, tail in (("0", "<--node-rank><0>"), ("1", "<--node-rank><1><--headless>")):
        out = subprocess.run(["/bin/sh", "-c", groups.SERVE_SCRIPT, "vllm-serve", "m", "--x", "a b", "$(y)"],
                             env={"PATH": f"{tmp_path}:/usr/bin:/bin", groups.NODE_RANK_ENV: rank},
                             capture_output=True, text=True, check=True).stdout
        assert out == "<serve><m><--x><a b><$(y)>" + tail


def test_headless_service_publishes_not_ready_pods_and_clients_reach_leaders() -> None:
    inputs = group_inputs()
    svc = groups.headless_service(inputs, 1)
    assert svc["metadata"]["name"] == "x-1" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][groups.GROUP_LABEL] == "1"
    assert groups.leader_selector(OWNER, leader_worker_set=False)[groups.POD_INDEX_LABEL] == "0"
    assert groups.leader_selector(OWNER, leader_worker_set=True)[groups.LWS_WORKER_INDEX_LABEL] == "0"


@pytest.mark.parametrize("name", ["a", "x" * 40, "y" * 63, "z" * 45 + "-" + "w" * 10])
def test_group_names_fit_pod_names_and_labels(name: str) -> None:
    names = {groups.group_name(name, i) for i in range(120)}
    assert len(names) == 120
    for n in names:
        assert len(n) <= 47 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n), n


def test_a_leader_worker_set_holds_every_group() -> None:
    lws = groups.leader_worker_set(group_inputs())
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1" and lws["spec"]["replicas"] == 1
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert leader["args"][-2:] == ["--node-rank", "0"] and "readinessProbe" in leader
    assert worker["args"][-3:] == ["--node-rank", "$(LWS_WORKER_INDEX)", "--headless"]
    assert "readinessProbe" not in worker  # a headless worker serves no /health
    assert "$(LWS_LEADER_ADDRESS)" in leader["args"]


def test_groups_summarise_as_one_replica_each() -> None:
    current = {"metadata": {"generation": 2}, "spec": {"template": {"metadata": {"annotations": {PLAN_HASH: "h"}}}},
               "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}}
    half = {**current, "status": {**current["status"], "readyReplicas": 1}}
    view = groups.groups_view([current, half], current_hash="h", size=2)
    assert view["status"]["availableReplicas"] == 1 and view["status"]["updatedReplicas"] == 2
    assert view["spec"]["template"]["metadata"]["annotations"] == {PLAN_HASH: "h"}
    stale = groups.groups_view([current, None], current_hash="h", size=2)
    assert stale["spec"]["template"]["metadata"]["annotations"] == {}


def test_scaled_object_drives_the_llmdeployment_on_kv_usage_and_waiting_requests() -> None:
    policy = LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, "autoscaling": {
        "minReplicas": 1, "maxReplicas": 4, "targetKVCacheUsage": 0.6, "targetWaitingRequests": 3,
        "pollingIntervalSeconds": 5, "scaleDownStabilizationSeconds": 20}}).autoscaling
    assert policy is not None
    so = scaled_object(OWNER, policy, PROM)
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment",
                                      "name": NAME}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 4, 5)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 20
    kv, waiting = spec["triggers"]
    assert kv["metadata"]["threshold"] == "0.6" and waiting["metadata"]["threshold"] == "3"
    assert kv["metadata"]["serverAddress"] == PROM and kv["metricType"] == "AverageValue"
    assert kv["metadata"]["query"] == kv_usage_query(OWNER)
    assert 'namespace="ns",llmdeployment="x"' in kv["metadata"]["query"]
    assert waiting["metadata"]["query"] == 'sum(vllm:num_requests_waiting{namespace="ns",llmdeployment="x"})'


def test_flag_values_in_every_spelling() -> None:
    assert flag_value(["--kv-offloading-size", "8"], "--kv-offloading-size") == "8"
    assert flag_value(["--kv_offloading_size=16", "--x"], "--kv-offloading-size") == "16"
    assert flag_value(["--x", "1"], "--kv-offloading-size") is None


def test_host_memory_is_added_to_the_request_and_the_limit() -> None:
    m = model("Qwen/Qwen3-14B")
    p = plan(PlanRequest(m, gpu("nvidia-l4"), behaviour_of(VLLMVersion(0, 33, 0)),
                         Targets(max_gpus=1, max_model_len=8192, allow_cpu_offload=True)))
    assert isinstance(p, Plan) and p.config.cpu_offload_gib > 0
    extra = ("--kv-offloading-size", "8")
    memory = host_memory(p, extra)
    assert memory.cpu_offload_gib == p.config.cpu_offload_gib and memory.kv_offloading_gib == 8
    assert memory.mm_cache_gib == 0  # Qwen3 is text only
    spec = LLMDeploymentSpec.model_validate({"model": {"name": m.model_id}})
    plain = WorkloadInputs(OWNER, spec, p, (), "img", ())
    more = WorkloadInputs(OWNER, spec, p, (), "img", (), host_memory_gib=memory.total_gib)
    base, added = container_resources(plain), container_resources(more)

    def gib(q: str) -> float:
        return float(q[:-2]) if q.endswith("Gi") else float(q[:-2]) / 1024

    assert gib(added["requests"]["memory"]) == pytest.approx(gib(base["requests"]["memory"]) + memory.total_gib,
                                                             abs=1 / 1024)
    assert gib(added["limits"]["memory"]) == pytest.approx(gib(base["limits"]["memory"]) + memory.total_gib,
                                                           abs=1 / 1024)


def test_multimodal_models_get_their_processor_cache() -> None:
    gemma = model("google/gemma-3-27b-it")
    p = plan(PlanRequest(gemma, gpu("nvidia-h100-80gb"), behaviour_of(VLLMVersion(0, 33, 0)), Targets()))
    assert isinstance(p, Plan)
    assert host_memory(p, ()).mm_cache_gib == 2 * MM_PROCESSOR_CACHE_GIB  # one API server + one engine core
    assert host_memory(p, ("--mm-processor-cache-gb", "0")).mm_cache_gib == 0


# --- the reconcile on an in-memory cluster -----------------------------------------------------------------------


def test_405b_renders_one_statefulset_group_over_two_h100_nodes() -> None:
    run = Run(LLAMA_405B, cluster=two_h100_nodes())
    run.once()
    sts = objects_of(run.cluster, "StatefulSet")
    assert list(sts) == ["x-0"] and sts["x-0"]["spec"]["replicas"] == 2
    services = objects_of(run.cluster, "Service")
    assert services["x-0"]["spec"]["clusterIP"] == "None"
    assert services["x"]["spec"]["selector"][groups.POD_INDEX_LABEL] == "0"
    assert ("Deployment", NAME) not in run.cluster.objects
    plan_status = run.status["plan"]
    assert plan_status["nodes"] == 2 and plan_status["tensorParallelSize"] == 8
    assert [s["layers"] for s in plan_status["stages"]] == [63, 63]
    assert plan_status["replicasThatFit"] == 1
    assert run.status["selector"].endswith("apps.kubernetes.io/pod-index=0")
    assert run.condition("Ready")["status"] == "False"  # no pod ready in the fake yet
    # the group's pods all ready -> Ready, one replica
    live = run.cluster.objects[("StatefulSet", "x-0")]
    live["status"].update(replicas=2, updatedReplicas=2, readyReplicas=2)
    run.once()
    assert run.condition("Ready")["status"] == "True" and run.status["readyReplicas"] == 1


def test_more_groups_than_wanted_are_parked_at_zero_pods() -> None:
    run = Run({**LLAMA_405B, "replicas": 1}, cluster=two_h100_nodes())
    run.once()
    run.cluster.objects[("StatefulSet", "x-1")] = {**run.cluster.objects[("StatefulSet", "x-0")]}
    run.once()
    assert run.cluster.objects[("StatefulSet", "x-1")]["spec"]["replicas"] == 0
    assert run.cluster.objects[("StatefulSet", "x-0")]["spec"]["replicas"] == 2


def test_a_deployment_left_by_a_single_node_plan_is_parked_without_the_owner_label() -> None:
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}},
              cluster=two_h100_nodes())
    run.once()
    assert run.cluster.deployment()["spec"]["replicas"] == 1
    run.spec = LLAMA_405B
    run.once()
    parked = run.cluster.deployment()
    assert parked["spec"]["replicas"] == 0 and "llm-autopilot.io/deployment" not in parked["metadata"]["labels"]


def test_with_the_lws_crd_the_groups_are_one_leader_worker_set() -> None:
    cluster = two_h100_nodes()
    cluster.objects[("CustomResourceDefinition", groups.LWS_CRD)] = {"metadata": {"name": groups.LWS_CRD}}
    run = Run(LLAMA_405B, cluster=cluster)
    run.once()
    assert ("LeaderWorkerSet", NAME) in cluster.objects and not objects_of(cluster, "StatefulSet")
    assert objects_of(cluster, "Service")[NAME]["spec"]["selector"][groups.LWS_WORKER_INDEX_LABEL] == "0"


def test_autoscaling_renders_a_scaled_object_and_follows_spec_replicas() -> None:
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "replicas": 3,
            "autoscaling": {"maxReplicas": 4, "prometheusAddress": PROM}}
    run = Run(spec, cluster=four_l4_nodes())
    run.once()
    so = run.cluster.objects[("ScaledObject", NAME)]
    assert so["spec"]["maxReplicaCount"] == 4 and INPUT_HASH in so["metadata"]["annotations"]
    assert run.cluster.deployment()["spec"]["replicas"] == 3
    assert run.status["plan"]["replicasThatFit"] == 4
    assert run.status["selector"] == "app.kubernetes.io/instance=x,app.kubernetes.io/name=vllm"


def test_more_replicas_than_the_pool_holds_are_refused_with_the_number_that_fits() -> None:
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
            "autoscaling": {"maxReplicas": 5, "prometheusAddress": PROM}}
    run = Run(spec, cluster=four_l4_nodes())
    run.once()
    planned = run.condition("Planned")
    assert planned["status"] == "False" and planned["reason"] == "TooManyReplicas"
    assert "set maxReplicas to 4 or fewer" in planned["message"] and "4 node(s) of 1 x L4" in planned["message"]
    assert {kind for kind, _ in run.cluster.objects} == {"CustomResourceDefinition"}  # nothing half-applied


def test_autoscaling_without_keda_says_so_and_applies_nothing() -> None:
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
               "autoscaling": {"maxReplicas": 2, "prometheusAddress": PROM}}, cluster=four_l4_nodes(keda=False))
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "NoKEDA" and "scaledobjects.keda.sh" in planned["message"]
    assert ("Deployment", NAME) not in run.cluster.objects


def test_autoscaling_without_prometheus_says_how_to_fix_it() -> None:
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
               "autoscaling": {"maxReplicas": 2}}, cluster=four_l4_nodes())
    run.once()
    assert run.condition("Planned")["reason"] == "NoPrometheus"
    assert "spec.autoscaling.prometheusAddress" in run.condition("Planned")["message"]


def test_offload_shows_in_the_status_and_the_pod_memory() -> None:
    run = Run({"model": {"name": "Qwen/Qwen3-14B"}, "gpu": {"product": "nvidia-l4", "maxGPUs": 1},
               "serving": {"maxModelLen": 8192, "allowCPUOffload": True}}, cluster=four_l4_nodes())
    run.once()
    status = run.status["plan"]
    assert status["cpuOffloadGiB"] > 0 and status["hostMemoryGiB"] == status["cpuOffloadGiB"]
    assert any(w.startswith("SLOW") for w in status["warnings"])
    args = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--cpu-offload-gb") + 1] == f"{status['cpuOffloadGiB']:g}"


def test_auto_length_is_rendered_as_the_planners_number() -> None:
    run = Run({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
               "serving": {"maxModelLen": "auto"}}, cluster=four_l4_nodes())
    run.once()
    args = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    length = args[args.index("--max-model-len") + 1]
    assert length.isdigit() and int(length) == run.status["plan"]["maxModelLen"]
    assert any(r.startswith(f"maxModelLen={length}: auto") for r in run.status["plan"]["reasons"])


# --- the ladder with an autoscaler -------------------------------------------------------------------------------


def running(**kwargs: Any) -> Running:
    return remediation_running(**{
        "max_model_len": 8192, "max_num_batched_tokens": 2048, "max_num_seqs": 256, "enforce_eager": False,
        "gpu_memory_utilization": 0.92, "fp8_kv_cache": True, "gpus": 1, "replicas": 1, "memory_limit_gib": 36.0,
        "fp8_kv_allowed": True, "max_gpus": 1, "max_replicas": 4, "node_memory_gib": 180.0,
        "floor_max_model_len": 8192, "floor_gpu_memory_utilization": 0.7, "floor_max_num_seqs": 8,
        "floor_max_num_batched_tokens": 512, **kwargs})


def test_kv_saturation_adds_a_replica_only_without_an_autoscaler() -> None:
    saturation = Classification(Signal.KV_SATURATION, "saturated")
    manual = [c.action for c in candidates(saturation, running(), Overrides())]
    assert manual[0] == "replicas 1 -> 2"
    autoscaled = [c.action for c in candidates(saturation, running(autoscaled=True), Overrides())]
    assert not any("replicas" in a for a in autoscaled) and autoscaled == ["max_num_seqs 256 -> 128"]


# --- admission -----------------------------------------------------------------------------------------------


def l4_nodes(count: int = 4) -> list[tuple[dict[str, str], int]]:
    return [(dict(L4), 1) for _ in range(count)]


def test_admission_refuses_more_replicas_than_the_pool_holds_with_the_number_that_fits() -> None:
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
            "autoscaling": {"maxReplicas": 5}}
    verdict = review(spec, V, nodes=l4_nodes)
    assert not verdict.allowed
    assert verdict.message == ("spec.autoscaling.maxReplicas 5 is more than the GPU pool holds: 4 replicas of "
                               "1 x L4 fit on its 4 node(s) of 1 x L4; set maxReplicas to 4 or fewer")
    assert review({**spec, "autoscaling": {"maxReplicas": 4}}, V, nodes=l4_nodes).allowed
    # without the nodes (no webhook cluster access) the reconcile refuses it instead
    assert review(spec, V).allowed


def test_admission_answers_auto_and_multi_node_at_apply_time() -> None:
    verdict = review({"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"},
                      "serving": {"maxModelLen": "auto"}}, V, nodes=l4_nodes)
    assert verdict.allowed
    assert any(re.fullmatch(r"serving.maxModelLen auto: \d+ on 1 x L4", w) for w in verdict.warnings)
    nodes = [(dict(H100), 8), (dict(H100), 8)]
    verdict = review(LLAMA_405B, V, nodes=lambda: nodes)
    assert verdict.allowed and any("each replica spans 2 nodes" in w for w in verdict.warnings)
    one_node = review(LLAMA_405B, V, nodes=lambda: nodes[:1])
    assert not one_node.allowed and "does not fit" in one_node.message


def test_a_pool_that_holds_a_replica_on_one_node_wins_over_spanning_nodes() -> None:
    # two 1-GPU L4 nodes hold Qwen3-14B in less GPU memory (46 GB) than one H100 (80 GB), but across nodes
    spec = LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-14B"}, "gpu": {"maxGPUs": 4},
                                             "serving": {"maxModelLen": 4096}})
    pools = gpu_pools(spec, [*l4_nodes(), (dict(H100), 8)])
    vllm = behaviour_of(VLLMVersion(0, 33, 0))
    l4 = plan(PlanRequest(model("Qwen/Qwen3-14B"), gpu("nvidia-l4"), vllm, targets_for_pool(spec, pools[0])))
    assert isinstance(l4, Plan) and l4.summary == "2 x L4 (2 nodes)"
    choice = choose_pool(pools, lambda pool: PlanRequest(model("Qwen/Qwen3-14B"), pool.gpu, vllm,
                                                         targets_for_pool(spec, pool)))
    assert isinstance(choice.result, Plan) and choice.result.config.nodes == 1
    assert choice.pool is not None and choice.pool.gpu.name == "nvidia-h100-80gb"


@pytest.mark.parametrize(("example", "nodes"), [
    ("llama-3.1-405b-multinode.yaml", [(dict(H100), 8), (dict(H100), 8)]),
    ("qwen3-8b-l4-autoscaled.yaml", [(dict(L4), 1)] * 4),
])
def test_the_examples_are_admitted_on_the_local_clusters_pools(example: str, nodes: list[tuple[dict[str, str], int]]
                                                               ) -> None:
    obj = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / example).read_text())
    verdict = review(obj["spec"], V, name=obj["metadata"]["name"], nodes=lambda: nodes)
    assert verdict.allowed, verdict.message


def test_back_on_one_node_a_leader_worker_set_is_parked() -> None:
    cluster = two_h100_nodes()
    cluster.objects[("CustomResourceDefinition", groups.LWS_CRD)] = {"metadata": {"name": groups.LWS_CRD}}
    run = Run(LLAMA_405B, cluster=cluster)
    run.once()
    assert cluster.objects[("LeaderWorkerSet", NAME)]["spec"]["replicas"] == 1
    run.spec = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}
    run.once()
    assert cluster.objects[("LeaderWorkerSet", NAME)]["spec"]["replicas"] == 0
    assert cluster.deployment()["spec"]["replicas"] == 1
