"""Which Secrets an LLMDeployment hands to its pods (the webhook checks the requester may read each)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.controller.access import referenced_secrets


def spec(**fields: object) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({"model": {"name": "Qwen/Qwen3-8B"}, **fields})


def test_the_hub_token_and_every_env_secret_are_referenced_once() -> None:
    s = spec(model={"name": "Qwen/Qwen3-8B", "hubTokenSecretRef": {"name": "hf"}},
             vllm={"env": [
                 {"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                 {"name": "B", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "other"}}},
                 {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "x"}}},
                 {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "E", "value": "plain"},
             ]})
    assert referenced_secrets(s) == ["db", "hf"]


def test_no_secret_no_review() -> None:
    assert referenced_secrets(spec()) == []


def test_a_malformed_secret_reference_never_reaches_the_review() -> None:
    """The typed EnvVarSource refuses it first, with its path: nothing to review, nothing admitted."""
    with pytest.raises(ValidationError, match="secretKeyRef"):
        spec(vllm={"env": [{"name": "X", "valueFrom": {"secretKeyRef": "oops"}}]})


def test_the_s3_credentials_secret_is_reviewed_too() -> None:
    s = spec(model={"name": "acme/tiny", "source": "s3://models/tiny",
                    "s3": {"endpoint": "http://s3.local:8333", "credentialsSecretRef": {"name": "s3-keys"}},
                    "cache": {"enabled": True}},
             vllm={"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]})
    assert referenced_secrets(s) == ["db", "s3-keys"]
