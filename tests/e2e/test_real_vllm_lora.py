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
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("real_vllm")]

ADAPTERS = ("gqa-r8-attn", "gqa-r16-all")
PROMPT = "The operator plans vLLM settings"


def completion(pod: dict[str, Any], model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, Any] = json.load(response)
    return result


def served_models(pod: dict[str, Any]) -> list[str]:
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8000/v1/models", timeout=30) as response:
        return [m["id"] for m in json.load(response)["data"]]


def test_two_adapters_are_served_beside_the_base_model(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    published = {a["name"]: a for a in vllm_cpu.publish_adapters(ADAPTERS)}
    lora = {"adapters": [{"name": "r8", "source": published["gqa-r8-attn"]["hub_id"]},
                         {"name": "r16", "source": f"hf://{published['gqa-r16-all']['hub_id']}"}]}
    with operator_for(kubectl, namespace, tmp_path):
        # eager: no torch.compile of the LoRA model (the start-up on a shared 2-core machine is long enough)
        apply(kubectl, namespace, tiny("lora", lora=lora, vllm={"enforceEager": True}))
        pod = wait_for("a Ready pod of the LoRA deployment", lambda: next(iter(ready_pods(kubectl, namespace, "lora")),
                                                                          None),
                       timeout=2 * START_SECONDS, interval=2)
        # one slot per adapter, at the default rank 16 (the adapters' ranks are 8 and 16)
        assert (arg(pod, "--max-loras"), arg(pod, "--max-lora-rank")) == ("2", "16"), pod["spec"]["containers"][0]
        assert "--enable-lora" in pod["spec"]["containers"][0]["args"]
        assert set(served_models(pod)) == {MODEL, "r8", "r16"}
        answers = {name: completion(pod, name) for name in (MODEL, "r8", "r16")}
        texts = {name: a["choices"][0]["text"] for name, a in answers.items()}
        for name, answer in answers.items():
            assert answer["model"] == name and answer["usage"]["completion_tokens"] == 8, answer
        # each adapter changes what the model writes (greedy decoding, random non-zero B): it is really applied
        assert len(set(texts.values())) == 3, texts
        status = llmd(kubectl, namespace, "lora")["status"]
        assert status["plan"]["loraAdapters"] == ["r8", "r16"], status["plan"]
        assert "loraSlotsGiB" in status["plan"]["memory"], status["plan"]["memory"]
        text = describe(kubectl, namespace, "lora")
        assert "r8" in text and "r16" in text
        sys.stderr.write(f"\n[real vLLM] LoRA: served {sorted(served_models(pod))}; greedy texts {texts}; "
                         f"args {' '.join(pod['spec']['containers'][0]['args'])}\n")
