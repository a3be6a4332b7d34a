"""Properties of the planner over the whole catalog (hypothesis)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_autopilot.catalog.gpus import GPUS
from llm_autopilot.catalog.models import catalog_models
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.domain.precision import KVCacheDtype, WeightFormat
from llm_autopilot.planner.memory import estimate
from llm_autopilot.planner.plan import Plan, PlanRequest, Targets
from llm_autopilot.planner.search import plan
from llm_autopilot.vllm.versions import VLLMVersion, behaviour_of

MODELS = catalog_models()
#: HYPOTHESIS_EXAMPLES=3000 for a deeper local run; CI uses the default.
EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "150"))
VERSIONS = [behaviour_of(VLLMVersion(0, 19, 0)), behaviour_of(VLLMVersion(0, 33, 0))]

formats = st.lists(st.sampled_from([WeightFormat.FP8, WeightFormat.AWQ, WeightFormat.GPTQ]), unique=True).map(
    lambda extra: (WeightFormat.NONE, *extra))
kv_dtypes = st.sampled_from([(KVCacheDtype.AUTO,), (KVCacheDtype.AUTO, KVCacheDtype.FP8)])


@st.composite
def targets(draw: st.DrawFn, *, pin_batch: bool = False) -> Targets:
    desired = draw(st.one_of(st.none(), st.integers(1024, 131072)))
    minimum = draw(st.one_of(st.none(), st.integers(256, desired or 131072)))
    return Targets(
        max_model_len=desired, min_max_model_len=minimum,
        concurrency=draw(st.one_of(st.none(), st.integers(1, 64))),
        allowed_weight_formats=draw(formats), allowed_kv_cache_dtypes=draw(kv_dtypes),
        max_gpus=draw(st.sampled_from([1, 2, 4, 8])),
        max_num_seqs=256 if pin_batch else None, max_num_batched_tokens=2048 if pin_batch else None,
    )


def _clip(model_max: int, t: Targets) -> Targets:
    if t.max_model_len and t.max_model_len > model_max:
        return Targets(**{**t.__dict__, "max_model_len": model_max,
                          "min_max_model_len": min(t.min_max_model_len or model_max, model_max)})
    return t


def badness(p: Plan) -> tuple[bool, int, int, int, int]:
    """Missing the concurrency target is worst; then GPUs, weight quality, KV quality, shorter context."""
    c = p.config
    return (bool(p.warnings), c.num_gpus, c.weight_format.quality_rank, c.kv_cache_dtype.quality_rank,
            -c.max_model_len)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.sampled_from(GPUS), st.sampled_from(VERSIONS), targets())
def test_a_plan_always_fits_by_the_estimate(model, gpu, vllm, t) -> None:  # type: ignore[no-untyped-def]
    result = plan(PlanRequest(model, gpu, vllm, _clip(model.max_position_embeddings, t)))
    if isinstance(result, Plan):
        again = estimate(result.config)
        assert again.fits, again.problems
        assert again.max_model_len_capacity >= result.config.max_model_len
        assert result.config.num_gpus <= t.max_gpus


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.sampled_from(GPUS), targets())
def test_tensor_parallel_size_divides_the_attention_heads(model, gpu, t) -> None:  # type: ignore[no-untyped-def]
    result = plan(PlanRequest(model, gpu, VERSIONS[1], _clip(model.max_position_embeddings, t)))
    if isinstance(result, Plan):
        tp = result.config.tensor_parallel_size
        assert model.num_attention_heads % tp == 0
        kv = model.num_kv_heads
        assert model.mla is not None or kv % tp == 0 or tp % kv == 0


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.floats(8, 200), st.floats(1.01, 3.0), targets(pin_batch=True))
def test_more_gpu_memory_never_gives_a_worse_plan(model, memory, factor, t) -> None:  # type: ignore[no-untyped-def]
    # Batch settings are pinned: vLLM's own defaults jump at 70 and 160 GiB, which is not a memory effect.
    t = _clip(model.max_position_embeddings, t)
    small = plan(PlanRequest(model, GPUSpec.custom(memory), VERSIONS[1], t))
    large = plan(PlanRequest(model, GPUSpec.custom(memory * factor), VERSIONS[1], t))
    if isinstance(small, Plan):
        assert isinstance(large, Plan)
        assert badness(large) <= badness(small)
