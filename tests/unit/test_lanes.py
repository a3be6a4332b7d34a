"""`make test`'s two lanes (tests/e2e/lanes.py): which lane an item runs in, and the order xdist hands them out."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.e2e import lanes


class _Item:
    """The parts of a pytest.Item that lanes reads and writes."""

    def __init__(self, name: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()) -> None:
        self.name, self.fixturenames, self.marks = name, fixtures, list(marks)
        self.nodeid = f"tests/x.py::{name}"

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks else None


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


def test_under_xdist_the_lanes_come_first_and_the_controller_reads_each_tests_lane(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    monkeypatch.setattr(lanes, "_run_dir", lambda uid="": tmp_path)
    items = _items()
    lanes.assign(cast(list[pytest.Item], items))
    assert [i.name for i in items] == ["standin-on-vllm-cpu", "real", "judge", "kwok-1", "kwok-2", "unit-a", "unit-b"]
    record = json.loads((tmp_path / "lanes-gw0.json").read_text())
    assert record == {**{f"tests/x.py::{n}": lanes.VLLM_CPU_LANE for n in ("standin-on-vllm-cpu", "real", "judge")},
                      **{f"tests/x.py::{n}": lanes.KWOK_LANE for n in ("kwok-1", "kwok-2")}}
    config = SimpleNamespace(getoption=lambda name, default=None: "uid" if name == "testrunuid" else 2,
                             getvalue=lambda name: None, option=SimpleNamespace(loadscopereorder=False))
    monkeypatch.setattr("xdist.scheduler.loadscope.parse_tx_spec_config", lambda _c: ["popen"] * 2)
    scheduler = lanes.LaneScheduling(cast(pytest.Config, config))
    scopes = [scheduler._split_scope(i.nodeid) for i in items]
    assert scopes == [lanes.VLLM_CPU_LANE] * 3 + [lanes.KWOK_LANE] * 2 + ["tests/x.py::unit-a", "tests/x.py::unit-b"]


def test_without_xdist_nothing_is_reordered_or_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lanes, "WORKER", "")
    monkeypatch.setattr(lanes, "_run_dir", lambda uid="": tmp_path)
    items = _items()
    lanes.assign(cast(list[pytest.Item], items))
    assert [i.name for i in items] == [i.name for i in _items()]
    assert not list(tmp_path.iterdir())


def test_only_the_last_worker_to_end_checks_leftovers_against_what_both_found(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lanes, "_run_dir", lambda uid="": tmp_path)
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    lanes.session_started({"namespace/default", "namespace/e2e-opgw1-probe"}, {"f"})
    monkeypatch.setattr(lanes, "WORKER", "gw1")
    lanes.session_started({"namespace/default"}, {"f", "g"})
    assert lanes.session_ended() is None  # gw0 still runs
    monkeypatch.setattr(lanes, "WORKER", "gw0")
    assert lanes.session_ended() == ({"namespace/default"}, {"f"})
    assert not list(tmp_path.glob("*.json"))
