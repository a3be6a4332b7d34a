"""The memory model against figures vLLM printed (see tests/golden.py for the cases and tolerances)."""

from __future__ import annotations

import pytest

from llm_autopilot.domain.precision import GIB
from llm_autopilot.planner.kv_cache import kv_bytes_per_request
from llm_autopilot.planner.memory import estimate
from tests.golden import OUT_OF_SCOPE, GoldenCase, compare, load_cases, within

CASES, RAW = load_cases()


def test_enough_golden_cases_with_sources() -> None:
    assert len(CASES) >= 15
    for c in CASES:
        assert c.source_url.startswith("https://"), c.id


def test_every_case_is_replayed_or_has_a_reason() -> None:
    ids = {c["id"] for c in RAW}
    assert set(OUT_OF_SCOPE) <= ids
    assert ids - set(OUT_OF_SCOPE) == {c.id for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_estimate_matches_what_vllm_printed(case: GoldenCase) -> None:
    compared = compare(case)
    assert "kv_cache_gib" in compared  # the figure that decides whether vLLM starts
    misses = {f: v for f, v in compared.items() if not within(f, *v, case.id)}
    assert not misses, f"{case.id} ({case.source_url}): printed vs estimated {misses}"


REFUSED = [c for c in CASES if next(r for r in RAW if r["id"] == c.id).get("started") is False]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.id)
def test_a_start_vllm_refused_is_refused_by_the_plan(case: GoldenCase) -> None:
    """vLLM's own check refused max_model_len: the plan must not promise it, and the KV cache one sequence needs is
    the figure vLLM printed ("X GiB KV cache is needed")."""
    assert REFUSED  # vllm#27508's gpt-oss-120b at 0.11.0
    c = case.config
    assert not estimate(c).fits
    needed = kv_bytes_per_request(c.model, c.tensor_parallel_size, c.pipeline_parallel_size, c.kv_cache_dtype,
                                  max_model_len=c.max_model_len,
                                  max_num_batched_tokens=c.max_num_batched_tokens
                                  * c.vllm.in_flight_batches(pipeline_parallel_size=c.pipeline_parallel_size),
                                  block_size=c.block_size, model_dtype_bytes=c.dtype_bytes)
    assert needed / GIB == pytest.approx(case.printed["kv_cache_needed_gib"], abs=0.01)
