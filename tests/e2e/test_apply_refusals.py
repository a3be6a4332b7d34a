"""Refused at apply on the local cluster (issue #28 items 5 and 6): an owned setting through a config argument's
keys, in the spellings vLLM's parser reads, and values the API server or S3 would refuse later (a cache PVC of 0
bytes, a bucket named as an IP address)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Kubectl, Operator

pytestmark = pytest.mark.e2e

GPU = {"product": "nvidia-l4", "maxGPUs": 1, "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}


def apply(kubectl: Kubectl, namespace: str, model: dict[str, Any], **spec: Any) -> tuple[int, str]:
    body = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "refused"},
            "spec": {"model": model, "gpu": GPU, **spec}}
    result = kubectl("apply", "-n", namespace, "-f", "-", check=False, input=yaml.safe_dump(body))
    return result.returncode, result.stderr


@pytest.mark.parametrize("args", [["--structured-outputs-config.reasoning_parser=deepseek_r1"],
                                  ["--structured-outputs-config", '{"reasoning_parser": "deepseek_r1"}'],
                                  ["--structured_outputs.reasoning_parser", "deepseek_r1"]])
def test_an_owned_setting_through_a_config_key_is_refused(kubectl: Kubectl, operator: Operator, namespace: str,
                                                          args: list[str]) -> None:
    code, stderr = apply(kubectl, namespace, {"name": "Qwen/Qwen3-8B"}, vllm={"extraArgs": args})
    assert code != 0 and "spec.vllm.reasoningParser" in stderr, stderr


@pytest.mark.parametrize("model, says", [
    ({"name": "Qwen/Qwen3-8B", "cache": {"enabled": True, "size": "0"}}, "cache.size"),
    ({"name": "Qwen/Qwen3-8B", "source": "s3://192.168.5.4/qwen", "cache": {"enabled": True}}, "IP address"),
])
def test_what_cannot_run_is_refused(kubectl: Kubectl, operator: Operator, namespace: str, model: dict[str, Any],
                                    says: str) -> None:
    code, stderr = apply(kubectl, namespace, model)
    assert code != 0 and says in stderr, stderr
