"""LoRA adapters on a real vLLM (the CPU build) on the local cluster's vllm-cpu pool.

The adapters are tiny PEFT adapters made locally (hack/tiny_adapters.py: random weights) and published as Hub
repositories of the local Hub-shaped server (``llm-autopilot/<name>``). The operator reads their
``adapter_config.json`` from that Hub, plans the slots, and renders ``--enable-lora --max-loras --max-lora-rank
--lora-modules name=llm-autopilot/<name>``; the vLLM pod downloads each adapter from the same Hub, as it would
from huggingface.co, and serves it under its own model name.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hack.localcluster import vllm_cpu

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    MODEL,
    START_SECONDS,
    apply,
    arg,
    describe,
    llmd,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

ADAPTERS = ("gqa-r8-attn", "gqa-r16-all")
ADDED = "gqa-r64-mlp"  # added to the spec once the first two answer
PROMPT = "The operator plans vLLM settings"


def completion(pod: dict[str, Any], model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, Any] = json.load(response)
    return result


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
