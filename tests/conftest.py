"""Shared fixtures: catalog look-ups and vLLM behaviour for the unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.catalog.gpus import find_gpu
from llm_autopilot.catalog.models import find_catalog_model
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.domain.gpu import GPUSpec
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VLLMBehaviour, behaviour_of
from tests.e2e import lanes

DATA = Path(__file__).parent / "data"


def model(model_id: str) -> ModelArchitecture:
    found = find_catalog_model(model_id)
    assert found is not None, model_id
    return found


def gpu(name: str) -> GPUSpec:
    return find_gpu(name)


@pytest.fixture
def vllm033() -> VLLMBehaviour:
    return behaviour_of(DEFAULT_VLLM_VERSION)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the end-to-end tests in their two lanes (tests/e2e/lanes.py)."""
    lanes.assign(items)


def pytest_configure(config: pytest.Config) -> None:
    lanes.configure(config)


@pytest.hookimpl(tryfirst=True)  # before xdist's own scheduler for --dist loadgroup
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return lanes.LaneScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None
