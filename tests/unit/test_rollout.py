"""Rollouts that keep serving (surge onto a free GPU) and a startup probe sized from the weights."""

from __future__ import annotations

import pytest

from llm_autopilot.controller.kube import NodeGPUs
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.pools import GPUPool
from llm_autopilot.planner.search import plan
from llm_autopilot.render import rollout
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, behaviour_of
from tests.conftest import gpu, model
from tests.unit.fakes import H100, FakeCluster, Run

KV_CRASH = ("ValueError: To serve at least one request with the model's max seq len (16384), (2.0 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (1.0 GiB). Based on the available memory, "
            "the estimated maximum model length is 8100.")


def a_plan(model_id: str, gpu_name: str, **targets: object) -> Plan:
    result = plan(PlanRequest(model(model_id), gpu(gpu_name), behaviour_of(DEFAULT_VLLM_VERSION),
                              Targets(**targets)))  # type: ignore[arg-type]
    assert isinstance(result, Plan), getattr(result, "message", "")
    return result


# --- startup probe ---------------------------------------------------------------------------------------


def test_the_startup_probe_grows_with_the_weights_and_the_download() -> None:
    small = a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", max_model_len=8192).config
    big = a_plan("meta-llama/Llama-3.1-70B-Instruct", "nvidia-h100-80gb", max_model_len=8192).config
    size = rollout.checkpoint_bytes(big)
    assert 130e9 < size < 150e9  # 70B in bf16
    cached = rollout.startup_seconds(big, downloads=False)
    downloading = rollout.startup_seconds(big, downloads=True)
    expected = rollout.ENGINE_START_SECONDS + size / rollout.LOAD_BYTES_PER_SECOND
    assert cached == pytest.approx(expected, abs=rollout.STARTUP_PERIOD_SECONDS)
    assert downloading == pytest.approx(expected + size / rollout.DOWNLOAD_BYTES_PER_SECOND,
                                        abs=rollout.STARTUP_PERIOD_SECONDS)
    assert downloading > 1800 > cached  # the old flat 30 minutes was too short for one, too long for the other
    assert rollout.startup_seconds(small, downloads=True) == rollout.MIN_STARTUP_SECONDS
    assert all(s % rollout.STARTUP_PERIOD_SECONDS == 0 for s in (cached, downloading))


def test_each_pod_of_a_replica_across_nodes_loads_its_share() -> None:
    spread = a_plan("meta-llama/Llama-3.1-405B", "nvidia-h100-80gb", max_model_len=8192,
                    gpus_per_node=8, max_gpus=16, max_nodes=2).config
    assert spread.nodes == 2
    size = rollout.checkpoint_bytes(spread)
    assert rollout.startup_seconds(spread, downloads=False) == pytest.approx(
        rollout.ENGINE_START_SECONDS + size / 2 / rollout.LOAD_BYTES_PER_SECOND, abs=rollout.STARTUP_PERIOD_SECONDS)


def test_the_rendered_probe_uses_the_sized_length() -> None:
    llama = {"name": "meta-llama/Llama-3.1-70B-Instruct"}
    for source, downloads in ((None, True), ("pvc://models/llama-70b", False)):
        spec = {"model": {**llama, **({"source": source} if source else {})},
                "gpu": {"product": "nvidia-h100-80gb"}, "serving": {"maxModelLen": 8192}}
        run = Run(spec)
        run.once()
        probe = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        config = a_plan(llama["name"], "nvidia-h100-80gb", max_model_len=8192, max_gpus=8).config
        assert probe["periodSeconds"] * probe["failureThreshold"] == rollout.startup_seconds(
            config, downloads=downloads), source


# --- surge -----------------------------------------------------------------------------------------------


def test_surge_needs_a_replica_more_than_asked_for() -> None:
    config = a_plan("Qwen/Qwen3-8B", "nvidia-h100-80gb", max_model_len=8192).config
    assert config.gpus_per_pod == 1
    one_gpu = GPUPool(gpu("nvidia-h100-80gb"), 1, ("NVIDIA-H100-80GB-HBM3",), 1)
    two_nodes = GPUPool(gpu("nvidia-h100-80gb"), 1, ("NVIDIA-H100-80GB-HBM3",), 2)
    assert not rollout.can_surge(config, one_gpu, replicas=1)
    assert rollout.can_surge(config, two_nodes, replicas=1)
    assert not rollout.can_surge(config, two_nodes, replicas=2)
    unseen = GPUPool(gpu("nvidia-h100-80gb"), 8, ("NVIDIA-H100-80GB-HBM3",), 0)  # no node seen: unknown
    assert not rollout.can_surge(config, unseen, replicas=1)


SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
        "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}, "remediation": {"cooldownSeconds": 0}}


def strategy(run: Run) -> dict[str, object]:
    return dict(run.cluster.deployment()["spec"]["strategy"]["rollingUpdate"])


def test_a_step_with_a_free_gpu_surges_and_says_nothing_of_an_outage() -> None:
    run = Run(SPEC)  # one 8 x H100 node: seven free GPUs
    run.once()
    assert strategy(run) == {"maxSurge": 1, "maxUnavailable": 0}
    run.cluster.crash(KV_CRASH)
    run.once()
    steps = [m for _, reason, m in run.last.events if reason == "Remediated"] if run.last else []
    assert steps and "outage" not in steps[0]
    assert strategy(run) == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_step_without_a_free_gpu_replaces_the_pod_and_says_it_is_an_outage() -> None:
    full = FakeCluster(nodes=[NodeGPUs(dict(H100), 1, 2000.0)])  # one GPU, held by the one replica
    run = Run(SPEC, cluster=full)
    run.once()
    assert strategy(run) == {"maxSurge": 0, "maxUnavailable": 1}
    run.cluster.crash(KV_CRASH)
    run.once()
    steps = [m for _, reason, m in run.last.events if reason == "Remediated"] if run.last else []
    assert steps and "no free GPU for a surge pod" in steps[0] and "an outage" in steps[0]
