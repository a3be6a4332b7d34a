"""`make bench-accuracy`'s grouping (tests/bench/golden_report.py): the KV-cache error per vLLM release, and the
releases with no golden log."""

from __future__ import annotations

import pytest

from tests.bench.golden_report import UNRECORDED, ReleaseError, per_release, release_of, without_logs


@pytest.mark.parametrize(("version", "release"), [("0.19.0", "0.19"), ("0.11.2", "0.11"), ("0.9.2", "0.9"),
                                                  (None, UNRECORDED), ("", UNRECORDED)])
def test_a_log_counts_for_its_minor_release(version: str | None, release: str) -> None:
    assert release_of(version) == release


def test_errors_are_grouped_per_release_oldest_first_unrecorded_last() -> None:
    rows = per_release([("0.19.0", 1.0), (None, -4.0), ("0.9.2", -2.0), ("0.19.1", -3.0)])
    assert rows == [ReleaseError("0.9", 1, 2.0, 2.0), ReleaseError("0.19", 2, 2.0, 3.0),
                    ReleaseError(UNRECORDED, 1, 4.0, 4.0)]


def test_the_releases_without_a_log_are_named() -> None:
    rows = per_release([("0.19.0", 1.0), ("0.11.0", 1.0)])
    assert without_logs(rows, ("0.11", "0.12", "0.19", "0.20")) == ["0.12", "0.20"]
