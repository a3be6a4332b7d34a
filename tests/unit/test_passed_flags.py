"""Spec fields passed to ``vllm serve`` as given (api/serve_flags.PASSED_FLAGS): each declared once, rendered after
the planned flags on the Deployment the reconcile writes, known to every release in the flag table, and refused in
extraArgs with the field to set instead (the written path "A new spec knob passed to vLLM")."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_autopilot.api.serve_flags import OWNED_FLAGS, PASSED_FLAGS, PassedFlag, extra_arg_problem
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, VLLMSettings
from llm_autopilot.controller.admission import review
from llm_autopilot.vllm.flags import examined_versions, known_flags
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import L4, Run

SPEC = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}}


def container_args(run: Run) -> list[str]:
    container = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


def test_every_row_names_a_field_of_the_vllm_settings_by_its_spec_alias() -> None:
    fields = VLLMSettings.model_fields
    for passed in PASSED_FLAGS:
        assert passed.field in fields, passed
        assert fields[passed.field].alias == passed.alias
        assert passed.flags[0].startswith("--")


@pytest.mark.parametrize("version", examined_versions(), ids=str)
def test_every_passed_flag_is_known_to_every_release_in_the_flag_table(version: object) -> None:
    known = known_flags(str(version))
    assert [f for p in PASSED_FLAGS for f in p.flags if f not in known] == []


def test_a_row_renders_unset_as_nothing_true_as_the_bare_flag_and_a_value_after_it() -> None:
    row = PassedFlag("x", "x", ("--x", "-x"))
    assert row.args(None) == [] and row.args(False) == [] and row.args(True) == ["--x"]
    assert row.args("a") == ["--x", "a"] and row.args(3) == ["--x", "3"]


def test_the_reasoning_parser_reaches_the_deployment_after_the_planned_flags() -> None:
    run = Run({**SPEC, "vllm": {"reasoningParser": "qwen3"}})
    run.once()
    args = container_args(run)
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"
    assert args.index("--max-model-len") < args.index("--reasoning-parser") < args.index("--port")
    planned = run.status["plan"]["args"]  # status.plan says what runs
    assert planned[planned.index("--reasoning-parser") + 1] == "qwen3"
    plain = Run(dict(SPEC))
    plain.once()
    assert "--reasoning-parser" not in container_args(plain)


def test_setting_the_field_rolls_the_pods_and_leaving_it_unset_does_not() -> None:
    before, same, changed = Run(dict(SPEC)), Run(dict(SPEC)), Run({**SPEC, "vllm": {"reasoningParser": "qwen3"}})
    for run in (before, same, changed):
        run.once()
    assert before.cluster.plan_hash() == same.cluster.plan_hash() != changed.cluster.plan_hash()


@pytest.mark.parametrize("written", ["--reasoning-parser", "--reasoning_parser", "--reasoning-parser=qwen3"])
def test_extra_args_naming_a_passed_flag_are_refused_with_the_field_to_set(written: str) -> None:
    problem = extra_arg_problem(written)
    assert problem is not None and "spec.vllm.reasoningParser" in problem
    assert "spec.vllm.reasoningParser" in OWNED_FLAGS["--reasoning-parser"]
    verdict = review({**SPEC, "vllm": {"extraArgs": [written, "qwen3"] if "=" not in written else [written]}},
                     str(DEFAULT_VLLM_VERSION), nodes=lambda: [(dict(L4), 1)])
    assert not verdict.allowed and "spec.vllm.reasoningParser" in verdict.message
    # a longer flag that starts the same way stays the user's
    assert extra_arg_problem("--reasoning-parser-plugin") is None


@pytest.mark.parametrize("name", ["Qwen3", "qwen3 --port 9", "", "-x", "x" * 65])
def test_a_parser_name_vllm_could_not_have_is_refused_at_apply(name: str) -> None:
    with pytest.raises(ValidationError, match="reasoningParser"):
        LLMDeploymentSpec.model_validate({**SPEC, "vllm": {"reasoningParser": name}})
