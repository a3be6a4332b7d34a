"""vLLM judges the plans: every catalog plan passes vLLM's own parser and ``create_engine_config()``, and
vLLM's ModelConfig reads every catalog architecture as the planner does.

vLLM 0.32.0 (the CPU build) runs the checks with its CUDA platform answering as each plan's catalog GPU;
see hack/vllm_judge.py for the two things that are not vLLM's own (the hardware queries NVML would answer,
and stand-ins for the CUDA kernel libraries the CPU build lacks, whose functions raise if called). A plan
vLLM refuses fails with vLLM's message: that is a planner bug.
"""

from __future__ import annotations

import pytest
from hack.localcluster import vllm_cpu

from llm_autopilot.catalog.gpus import GPUS
from llm_autopilot.catalog.models import catalog_models
from tests.vllm import judging

pytestmark = pytest.mark.vllm

PLAN_IDS = sorted(judging.catalog_plans()[0])
MODEL_IDS = [f"model:{m.model_id}" for m in catalog_models()]
CONTROL_IDS = ["control:tensor-parallel-3", "control:max-model-len-above-the-model", "control:flag-the-version-lacks",
               "control:mxfp4-on-a-t4"]

#: Planner bugs the judge found and that are not fixed yet (strict: a test fails once the planner agrees).
#: Gemma on a T4 was one: vLLM runs it in float32 there (no bfloat16, float16 refused for Gemma), which the
#: planner now refuses (planner/memory.py structural_problems) instead of sizing 2-byte weights.
KNOWN_PLANNER_BUGS: dict[str, str] = {}


def _known_bug(case_id: str) -> list[pytest.MarkDecorator]:
    reason = KNOWN_PLANNER_BUGS.get(case_id)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def test_the_judge_runs_vllms_cuda_platform_as_the_catalog_gpu(judged: judging.Judged) -> None:
    raw = judged.judgement.raw
    assert raw["vllm_version"].startswith(str(judging.JUDGED_VERSION)), raw["vllm_version"]
    assert raw["judging_platform"] == "vllm.platforms.cuda.CudaPlatformBase"
    assert raw["platform_leaks"] == [], "modules that would judge with the host's platform"
    assert set(raw["kernel_stand_ins"]) <= {"vllm._C_stable_libtorch", "vllm.vllm_flash_attn"}
    # the CUDA platform's block size, not the CPU platform's 128
    assert {v.facts["block_size"] for v in judged.judgement.verdicts.values() if v.accepted} == {16}


def test_every_model_and_gpu_is_judged(judged: judging.Judged) -> None:
    default = [i for i in judged.plans if i.startswith("default:")]
    assert len(default) + len(judged.infeasible["default"]) == len(catalog_models()) * len(GPUS)
    assert {judged.plans[i].model.model_id for i in default} == {m.model_id for m in catalog_models()}
    assert len(judged.plans) > 600


@pytest.mark.parametrize("case_id", PLAN_IDS)
def test_vllm_accepts_the_plan(judged: judging.Judged, case_id: str) -> None:
    verdict = judged.judgement[case_id]
    assert verdict.accepted, f"vLLM {verdict}: vllm serve {' '.join(judged.plans[case_id].args)}"


@pytest.mark.parametrize("case_id", [pytest.param(i, marks=_known_bug(i)) for i in PLAN_IDS])
def test_vllm_reads_the_plan_as_the_planner_does(judged: judging.Judged, case_id: str) -> None:
    case, verdict = judged.plans[case_id], judged.judgement[case_id]
    assert verdict.accepted and case.config is not None, str(verdict)
    assert judging.plan_disagreements(case.config, verdict.facts) == []


@pytest.mark.parametrize("case_id", MODEL_IDS)
def test_vllm_reads_the_architecture_as_the_planner_does(judged: judging.Judged, case_id: str) -> None:
    """Head size, KV heads, layers, sliding window, dtype and the derived maximum length of each catalog
    config.json, as vLLM's ModelConfig reads it on a GPU that takes every dtype."""
    case, verdict = judged.models[case_id], judged.judgement[case_id]
    assert verdict.accepted, str(verdict)
    assert judging.model_disagreements(case.model, verdict.facts) == []


@pytest.mark.parametrize("case_id", CONTROL_IDS)
def test_vllm_and_the_planner_refuse_alike(judged: judging.Judged, case_id: str) -> None:
    control = judged.controls[case_id]
    verdict = judged.judgement[case_id]
    assert not verdict.accepted, f"vLLM accepted {' '.join(control.case.args)}"
    assert control.vllm_says in (verdict.error or ""), verdict.error
    assert control.planner_message is not None, "the planner (or the webhook) accepted it"
    assert control.planner_says in control.planner_message, control.planner_message


def test_known_planner_bugs_name_judged_plans(judged: judging.Judged) -> None:
    assert set(KNOWN_PLANNER_BUGS) <= set(PLAN_IDS)
    assert set(judged.controls) == set(CONTROL_IDS)


def test_a_missing_vllm_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_cpu, "installed", lambda *_: False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"hack/cluster\.py vllm install"):
        judging.require_vllm()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        judging.require_vllm()
