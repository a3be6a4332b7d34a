"""The memory model against figures vLLM printed (see tests/golden.py for the cases and tolerances)."""

from __future__ import annotations

import pytest

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
