"""Tests that need the CPU build of vLLM (``python3 hack/cluster.py vllm install``), in its own environment.

They skip on a developer's machine without it, and fail in CI (``CI`` set), where the environment is
installed: a required test that skips proves nothing. One run of hack/vllm_judge.py serves the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_autopilot.catalog.models import catalog_models
from tests.vllm import judging

_SUMMARY: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the CPU build of vLLM (hack/cluster.py vllm install); "
                                       "fails instead of skipping when CI is set")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return judging.require_vllm()


@pytest.fixture(scope="session")
def judged(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[judging.Judged]:
    scratch = tmp_path_factory.mktemp("vllm-judge")
    folders = judging.write_configs(scratch / "models", catalog_models())
    plans, infeasible = judging.catalog_plan_cases(folders)
    models = {c.id: c for c in judging.model_cases(folders)}
    controls = {c.case.id: c for c in judging.negative_controls(folders)}
    cases = [*plans.values(), *models.values(), *(c.case for c in controls.values())]
    judgement = judging.run_judge(vllm_python, cases, scratch)
    result = judging.Judged(plans, infeasible, models, controls, judgement)
    _SUMMARY[:] = judging.summary(result)
    yield result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SUMMARY:
        terminalreporter.section("vLLM judges the plans")
        for line in _SUMMARY:
            terminalreporter.write_line(line)
