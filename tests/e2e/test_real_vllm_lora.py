"""LoRA adapters on a real vLLM (the CPU build) on the local cluster's vllm-cpu pool.

The adapters are tiny PEFT adapters made locally (hack/tiny_adapters.py: random weights) and published as Hub
repositories of the local Hub-shaped server (``llm-autopilot/<name>``). The operator reads their
``adapter_config.json`` from that Hub, plans the slots, and renders ``--enable-lora --max-loras --max-lora-rank
--lora-modules name=llm-autopilot/<name>``; the vLLM pod downloads each adapter from the same Hub, as it would
from huggingface.co, and serves it under its own model name.

The second test runs vLLM with a simulated device memory (the process kubelet's opt-in
``llm-autopilot.io/device-memory-bytes``): vLLM's CPU worker then does a GPU's accounting, its KV cache being the
budget (device size x gpu_memory_utilization) less what loading used, LoRA slots included, so too many slots are
a real start-up failure, vLLM's own.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import kubelet, vllm_cpu

from llm_autopilot.catalog.hf_config import parse_hf_config
from llm_autopilot.domain.precision import KVCacheDtype
from llm_autopilot.planner import lora as lora_memory
from llm_autopilot.planner.kv_cache import kv_bytes_per_token
from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    MODEL,
    START_SECONDS,
    apply,
    arg,
    complete,
    describe,
    llmd,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
    wait_steps,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]

ADAPTERS = ("gqa-r8-attn", "gqa-r16-all")
ADDED = "gqa-r64-mlp"  # added to the spec once the first two answer
PROMPT = "The operator plans vLLM settings"


def completion(pod: dict[str, Any], model: str) -> dict[str, Any]:
    return complete(pod, PROMPT, 120, model=model, temperature=0.0)


def served_models(pod: dict[str, Any]) -> set[str]:
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/v1/models", timeout=30) as response:
        return {m["id"] for m in json.load(response)["data"]}


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses") or [])


def lora_status(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    return dict(llmd(kubectl, namespace, "lora").get("status", {}).get("lora") or {})


def test_adapters_are_served_beside_the_base_model_and_changed_without_a_restart(
        kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    published = {a["name"]: a for a in vllm_cpu.publish_adapters((*ADAPTERS, ADDED))}
    adapters = [{"name": "r8", "source": published["gqa-r8-attn"]["hub_id"]},
                {"name": "r16", "source": f"hf://{published['gqa-r16-all']['hub_id']}"}]
    # maxLoras and maxLoraRank set: their defaults follow the adapters, and a change of them is a rollout
    lora = {"adapters": adapters, "maxLoras": 2, "maxLoraRank": 64, "runtimeUpdates": True}
    with operator_for(kubectl, namespace, tmp_path):
        # eager: no torch.compile of the LoRA model (the start-up on a shared 2-core machine is long enough)
        apply(kubectl, namespace, tiny("lora", lora=lora, vllm={"enforceEager": True}))
        pod = wait_for("a Ready pod of the LoRA deployment", lambda: next(iter(ready_pods(kubectl, namespace, "lora")),
                                                                          None),
                       timeout=2 * START_SECONDS, interval=2)
        container = pod["spec"]["containers"][0]
        assert (arg(pod, "--max-loras"), arg(pod, "--max-lora-rank")) == ("2", "64"), container
        assert "--enable-lora" in container["args"] and "--lora-modules" not in container["args"], container
        assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "true"} in container["env"], container
        # runtime: the operator loads the adapters onto the Ready pod (vLLM's /v1/load_lora_adapter)
        wait_for("the operator to load both adapters", lambda: served_models(pod) == {MODEL, "r8", "r16"},
                 timeout=120, interval=2)
        answers = {name: completion(pod, name) for name in (MODEL, "r8", "r16")}
        texts = {name: a["choices"][0]["text"] for name, a in answers.items()}
        for name, answer in answers.items():
            assert answer["model"] == name and answer["usage"]["completion_tokens"] == 8, answer
        # each adapter changes what the model writes (greedy decoding, random non-zero B): it is really applied
        assert len(set(texts.values())) == 3, texts
        status = llmd(kubectl, namespace, "lora")["status"]
        assert status["plan"]["loraAdapters"] == ["r8", "r16"], status["plan"]
        assert "loraSlotsGiB" in status["plan"]["memory"], status["plan"]["memory"]
        name = pod["metadata"]["name"]
        wait_for("status.lora to list both adapters on the pod", lambda: [
            (a["name"], a["applied"], a.get("pods")) for a in lora_status(kubectl, namespace).get("adapters", [])
        ] == [("r8", "Runtime", [name]), ("r16", "Runtime", [name])], timeout=60, interval=2)
        assert lora_status(kubectl, namespace)["updates"] == "Runtime"
        text = describe(kubectl, namespace, "lora")
        assert "r8" in text and "r16" in text
        sys.stderr.write(f"\n[real vLLM] LoRA: served {sorted(served_models(pod))}; greedy texts {texts}; "
                         f"args {' '.join(container['args'])}\n")

        # a third adapter added and one removed: applied to the running pod, no restart, no new pod
        uid, restarted = pod["metadata"]["uid"], restarts(pod)
        changed = [adapters[1], {"name": "r64", "source": published[ADDED]["hub_id"]}]
        apply(kubectl, namespace, tiny("lora", lora={**lora, "adapters": changed}, vllm={"enforceEager": True}))
        wait_for("r64 served and r8 gone", lambda: served_models(pod) == {MODEL, "r16", "r64"}, timeout=180,
                 interval=2)
        answer = completion(pod, "r64")
        assert answer["model"] == "r64" and answer["choices"][0]["text"] not in texts.values(), answer
        with pytest.raises(urllib.error.HTTPError) as gone:
            completion(pod, "r8")
        assert gone.value.code == 404
        now = [p for p in pods(kubectl, namespace, "lora") if not p["metadata"].get("deletionTimestamp")]
        assert [(p["metadata"]["uid"], restarts(p)) for p in now] == [(uid, restarted)], now
        wait_for("status.lora to say where the adapters are", lambda: (
            [(a["name"], a.get("pods")) for a in lora_status(kubectl, namespace).get("adapters", [])],
            lora_status(kubectl, namespace).get("removing", [])) == ([("r16", [name]), ("r64", [name])], []),
            timeout=60, interval=2)
        assert llmd(kubectl, namespace, "lora")["status"]["plan"]["loraAdapters"] == ["r16", "r64"]
        reasons = {e["reason"] for e in kubectl.json("events", "-n", namespace)["items"]}
        assert {"LoRAAdapterLoaded", "LoRAAdapterUnloaded"} <= reasons, reasons
        sys.stderr.write(f"[real vLLM] LoRA at runtime: served {sorted(served_models(pod))} on {name} "
                         f"(restartCount {restarted}, same pod uid); r64 wrote {answer['choices'][0]['text']!r}\n")


# ---- max_loras too high for the KV room: a real start-up failure, the rung, serving ---------------------------

GIB = 2**30
MIB = 2**20
RANK = 512  # the largest rank vLLM takes: the most bytes per slot (5.25 MiB on the tiny model), far above the noise
BASE_SLOTS, TOO_MANY, HALF = 2, 64, 32
#: the device of the measuring start: room for the tiny vLLM's ~1 GiB of non-KV memory and a KV cache
BASE_DEVICE = 2 * GIB
#: vLLM's "Auto set (kv/total) GiB for KV cache ... N GiB memory was consumed by non-kv usages" (cpu_worker.py)
AUTO_SET = re.compile(r"Auto set \(([\d.]+)/([\d.]+)\) GiB for KV cache on node \d+, with ([\d.]+) GiB requested "
                      r"memory for the worker\. ([\d.]+) GiB memory was consumed by non-kv usages")
#: its failure: "... on kv cache allocation is less than requested memory for kv (-x/y GiB)"
NO_ROOM = re.compile(r"less than requested memory for kv \((-?[\d.]+)/([\d.]+) GiB\)")
KV_TOKENS = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
#: both sides of the chosen budget must clear the slots they tell apart by this much; three starts of the same
#: settings differed by 1.2 MiB of RSS here, and a slot at rank 512 cost 5.29 MiB where the planner counts 5.25
#: (README, "LoRA adapters")
MARGIN_BYTES = 48 * MIB
#: how close vLLM's non-KV memory must come to the base's plus the planner's slot bytes: 0.04 MiB a slot more
#: (2.5 MiB over 62 slots) and 1.2 MiB of noise, plus, for the failure, its line's rounding to 0.01 GiB (5.1 MiB
#: either way; KV tokens give the others to a block, 64 KiB here)
FAILURE_TOLERANCE, SERVING_TOLERANCE = 12 * MIB, 6 * MIB


@pytest.fixture(name="device_memory")
def device_memory_fixture(kubectl: Kubectl, namespace: str) -> Iterator[Callable[[int | None], None]]:
    """Give this namespace's vLLM pods on the vllm-cpu nodes a simulated device of N bytes (the process kubelet's
    opt-in, read when a container starts; other namespaces' pods are not affected); removed after."""

    def set_size(size: int | None) -> None:
        for node in kubelet.node_names():
            if size is None:
                kubectl("annotate", "node", node, f"{kubelet.DEVICE_MEMORY_ANNOTATION}-",
                        f"{kubelet.DEVICE_MEMORY_NAMESPACE_ANNOTATION}-")
            else:
                kubectl("annotate", "node", node, "--overwrite", f"{kubelet.DEVICE_MEMORY_ANNOTATION}={size}",
                        f"{kubelet.DEVICE_MEMORY_NAMESPACE_ANNOTATION}={namespace}")

    try:
        yield set_size
    finally:
        set_size(None)


def budget(device_bytes: int, utilization: float) -> int:
    """vLLM's budget on a device of that size (``CPUWorker.__init__``: ``ceil(MemTotal x
    gpu_memory_utilization)``, MemTotal read in kB)."""
    return math.ceil(device_bytes // 1024 * 1024 * utilization)


def log_of(kubectl: Kubectl, namespace: str, pod: dict[str, Any]) -> str:
    return kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout


def non_kv_bytes(log: str, budget_bytes: int, per_token: int) -> int:
    """What vLLM counted as used before its KV cache (its worker's RSS): its budget less the KV cache it made, from
    the tokens it printed (its "consumed by non-kv usages" figure is rounded to 0.01 GiB)."""
    tokens = KV_TOKENS.search(log)
    assert tokens is not None, log[-2000:]
    return budget_bytes - int(tokens.group(1).replace(",", "")) * per_token


def test_too_many_adapter_slots_fail_vllms_start_the_rung_halves_them_and_it_serves(
        kubectl: Kubectl, namespace: str, tmp_path: Path, device_memory: Callable[[int | None], None],
        real_vllm: list[dict[str, Any]]) -> None:
    published = {a["name"]: a for a in vllm_cpu.publish_adapters(ADAPTERS)}
    adapters = [{"name": "r8", "source": published["gqa-r8-attn"]["hub_id"]},
                {"name": "r16", "source": published["gqa-r16-all"]["hub_id"]}]
    config = next(m["config"] for m in real_vllm if m["id"] == MODEL)
    model = parse_hf_config(config, MODEL)
    per_token = kv_bytes_per_token(model, 1, 1, KVCacheDtype.AUTO)

    def slots(count: int) -> int:  # the planner's slot bytes, equal to vLLM's (tests/unit/test_vllm_lora_golden.py)
        return lora_memory.slot_bytes(model, 1, model.num_layers, 0, lora_memory.LoRASettings(count, RANK),
                                      dtype_bytes=2)

    started = time.monotonic()
    with operator_for(kubectl, namespace, tmp_path):
        # 1. the base: a start with few slots on a device with room, to read what loading uses here
        device_memory(BASE_DEVICE)
        lora = {"adapters": adapters, "maxLoras": BASE_SLOTS, "maxLoraRank": RANK}
        apply(kubectl, namespace, tiny("base", lora=lora, vllm={"enforceEager": True}))
        pod = wait_for("a Ready pod of the base", lambda: next(iter(ready_pods(kubectl, namespace, "base")), None),
                       timeout=2 * START_SECONDS, interval=2)
        args = pod["spec"]["containers"][0]["args"]
        assert arg(pod, "--max-loras") == str(BASE_SLOTS) and "--kv-cache-memory-bytes" not in args, args
        auto = wait_for("vLLM's KV sizing line", lambda: AUTO_SET.search(log_of(kubectl, namespace, pod)),
                        timeout=60, interval=2)
        plan = llmd(kubectl, namespace, "base")["status"]["plan"]
        utilization, batched = float(plan["gpuMemoryUtilization"]), int(plan["maxNumBatchedTokens"])
        # vLLM's budget is the simulated device's: its size x gpu_memory_utilization
        assert float(auto.group(3)) == round(budget(BASE_DEVICE, utilization) / GIB, 2), auto.group(0)
        # the worker's RSS after loading, with BASE_SLOTS slots
        base_used = non_kv_bytes(log_of(kubectl, namespace, pod), budget(BASE_DEVICE, utilization), per_token)
        assert base_used == pytest.approx(float(auto.group(4)) * GIB, abs=0.006 * GIB), (auto.group(0), base_used)
        kubectl("delete", "llmd", "base", "-n", namespace, "--wait=true", "--timeout=60s")
        wait_for("the base's pods to go", lambda: not pods(kubectl, namespace, "base"), timeout=120, interval=2)

        # 2. a device whose budget lies halfway between what 64 and what 32 slots leave after loading
        used = {n: base_used + slots(n) - slots(BASE_SLOTS) for n in (TOO_MANY, HALF)}
        device = math.ceil((used[TOO_MANY] + used[HALF]) / 2 / utilization / 1024) * 1024
        room = {n: budget(device, utilization) - used[n] for n in used}
        assert room[TOO_MANY] < -MARGIN_BYTES and room[HALF] > MARGIN_BYTES, room
        device_memory(device)

        # 3. 64 slots: vLLM fails at start-up, nothing left for its KV cache. On that signal the ladder tries fewer
        # batched tokens first; their floor pins them at the plan's value, so the slots' rung is the one that answers
        lora = {**lora, "maxLoras": TOO_MANY}
        apply(kubectl, namespace, tiny("slots", lora=lora, vllm={"enforceEager": True},
                                       remediation={"floors": {"minMaxNumBatchedTokens": batched}}))
        step = wait_steps(kubectl, namespace, "slots", 1, 2 * START_SECONDS)[0]
        evidence = step["evidence"]
        failure = NO_ROOM.search(evidence.get("message", ""))
        assert step["signal"] == "NoKVCacheMemory" and failure is not None, step
        assert "on kv cache allocation is less than requested memory for kv" in evidence["message"], evidence
        assert evidence["source"].startswith("previous container log"), evidence  # vLLM's own line
        assert step["action"].startswith(f"max_loras {TOO_MANY} -> {HALF}"), step
        status = llmd(kubectl, namespace, "slots")["status"]
        assert status["remediation"]["applied"][-1]["maxLoras"] == HALF, status["remediation"]
        # vLLM's own figures, to its 0.01 GiB: the budget it asked for, and so the non-KV memory it found
        asked, short = float(failure.group(2)) * GIB, float(failure.group(1)) * GIB
        assert asked == pytest.approx(budget(device, utilization), abs=0.006 * GIB), failure.group(0)
        assert budget(device, utilization) - short == pytest.approx(used[TOO_MANY], abs=FAILURE_TOLERANCE), (
            failure.group(0), used)

        # 4. serving with 32 slots, an adapter answering
        pod = wait_for("a Ready pod with 32 slots", lambda: next(
            (p for p in ready_pods(kubectl, namespace, "slots") if arg(p, "--max-loras") == str(HALF)), None),
            timeout=2 * START_SECONDS, interval=2)
        answer = completion(pod, "r16")
        assert answer["model"] == "r16" and answer["usage"]["completion_tokens"] == 8, answer
        log = log_of(kubectl, namespace, pod)
        served = AUTO_SET.search(log)
        assert served is not None, log[-2000:]
        # what the 30 slots more than the base cost is what the planner counts, to a few MiB of RSS noise
        serving_used = non_kv_bytes(log, budget(device, utilization), per_token)
        assert serving_used == pytest.approx(used[HALF], abs=SERVING_TOLERANCE), (served.group(0), used)
        tokens = KV_TOKENS.search(log)
        sys.stderr.write(
            f"\n[real vLLM] LoRA slots: base ({BASE_SLOTS} x rank {RANK}, device {BASE_DEVICE / GIB:g} GiB): "
            f"{auto.group(0)!r}; planner's slots {slots(BASE_SLOTS) / MIB:.2f} / {slots(HALF) / MIB:.2f} / "
            f"{slots(TOO_MANY) / MIB:.2f} MiB; device {device} bytes ({device / GIB:.3f} GiB), predicted KV room "
            f"{room[TOO_MANY] / MIB:.0f} MiB at {TOO_MANY}, {room[HALF] / MIB:.0f} MiB at {HALF}; vLLM at "
            f"{TOO_MANY}: {failure.group(0)!r}; step {step['action']!r}; at {HALF}: {served.group(0)!r}, "
            f"{tokens.group(0) if tokens else '?'}; non-KV memory (from the KV tokens): base {base_used / MIB:.2f} "
            f"MiB, at {HALF} {serving_used / MIB:.2f} MiB where {used[HALF] / MIB:.2f} was predicted; r16 wrote "
            f"{answer['choices'][0]['text']!r}; {time.monotonic() - started:.0f} s\n")
