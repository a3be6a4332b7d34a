"""Owned settings reached through a config argument's keys (issue #28 item 5): every spelling vLLM's
FlexibleArgumentParser reads (``--<config>.<key>=v``, ``--<config>.<key> v``, underscores, prefixes, ``+`` lists,
JSON after ``=`` or in the next argument) is refused, at admission and where the args are rendered."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_autopilot.api.serve_flags import OWNED_CONFIG_KEYS, OWNED_FLAGS, extra_args_problems
from llm_autopilot.api.v1alpha1 import VLLMSettings
from llm_autopilot.render.vllm_args import ExtraArgRefused, ServeOptions
from llm_autopilot.vllm.flags import known_flags
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION

REFUSED = [
    ["--structured-outputs-config.reasoning_parser=deepseek_r1"],
    ["--structured-outputs-config.reasoning_parser", "deepseek_r1"],
    ["--structured_outputs_config.reasoning_parser=deepseek_r1"],
    ["--structured-outputs-config.reasoning-parser=deepseek_r1"],
    ["--structured-outputs.reasoning_parser=deepseek_r1"],  # an unambiguous prefix
    ["--structured-outputs-config.reasoning_parser+", "a,b"],
    ['--structured-outputs-config={"reasoning_parser": "deepseek_r1"}'],
    ["--structured-outputs-config", '{"reasoning_parser": "deepseek_r1", "backend": "xgrammar"}'],
    ["--structured_outputs_config", '{"reasoning-parser": "qwen3"}'],
    ["--reasoning-config.reasoning_parser=qwen3"],
    ["--reasoning-config", '{"reasoning_parser": "qwen3"}'],
    ["--max-num-seqs=1"],  # owned outright, as before
    ["--quantization-config", '{"linear": "fp8"}'],  # online quantization changes the weights the plan sized
    ["--quantization-config.linear=fp8"],
]

ADMITTED = [
    ["--structured-outputs-config.backend=xgrammar"],
    ["--structured-outputs-config", '{"backend": "xgrammar"}'],
    ["--structured-outputs-config", "not json"],
    ["--reasoning-config.reasoning_start_str=<think>"],
    ["--chat-template", '{"reasoning_parser": "x"}'],  # a value of another flag
    ["--enable-prefix-caching"],
    [],
]


@pytest.mark.parametrize("args", REFUSED, ids=lambda a: " ".join(a) or "none")
def test_owned_settings_through_config_keys_are_refused(args: list[str]) -> None:
    problems = extra_args_problems(args)
    assert problems and problems[0][0] == 0
    with pytest.raises(ValidationError, match=r"owned by the operator|which the operator owns"):
        VLLMSettings.model_validate({"extraArgs": args})
    with pytest.raises(ExtraArgRefused):
        ServeOptions(extra_args=tuple(args))


def test_the_message_names_the_key_and_the_field_to_set() -> None:
    [(_, message)] = extra_args_problems(["--structured-outputs-config", '{"reasoning_parser": "qwen3"}'])
    assert "--structured-outputs-config's reasoning_parser" in message and "spec.vllm.reasoningParser" in message


@pytest.mark.parametrize("args", ADMITTED, ids=lambda a: " ".join(a) or "none")
def test_other_config_keys_pass(args: list[str]) -> None:
    assert extra_args_problems(args) == []
    assert VLLMSettings.model_validate({"extraArgs": args}).extra_args == args


def test_the_config_arguments_are_the_releases_own() -> None:
    known = known_flags(str(DEFAULT_VLLM_VERSION))
    assert set(OWNED_CONFIG_KEYS) <= known
    assert "--quantization-config" in known and "--quantization-config" in OWNED_FLAGS
