"""The operator's scale knobs from the environment, and the one-line refusal of a malformed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_autopilot.controller import settings
from llm_autopilot.controller.settings import OperatorSettings, SettingsError


def test_scale_knobs_and_their_defaults() -> None:
    defaults = OperatorSettings.from_env({})
    assert (defaults.resync_seconds, defaults.full_check_seconds, defaults.max_workers,
            defaults.admission_workers) == (60, 600, None, 2)
    assert defaults.prometheus_round_seconds == 30  # half the resync interval
    s = OperatorSettings.from_env({"LLM_AUTOPILOT_RESYNC_SECONDS": "10", "LLM_AUTOPILOT_FULL_CHECK_SECONDS": "120",
                                   "LLM_AUTOPILOT_MAX_WORKERS": "4", "LLM_AUTOPILOT_ADMISSION_WORKERS": "3",
                                   "LLM_AUTOPILOT_PROMETHEUS_ROUND_SECONDS": "2"})
    assert (s.resync_seconds, s.full_check_seconds, s.max_workers, s.admission_workers,
            s.prometheus_round_seconds) == (10, 120, 4, 3, 2)
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_RESYNC_SECONDS": "10"}).prometheus_round_seconds == 5


@pytest.mark.parametrize(("key", "value"), [("LLM_AUTOPILOT_MAX_WORKERS", "0"), ("LLM_AUTOPILOT_MAX_WORKERS", "2.5"),
                                            ("LLM_AUTOPILOT_ADMISSION_WORKERS", "many"),
                                            ("LLM_AUTOPILOT_RESYNC_SECONDS", "0"),
                                            ("LLM_AUTOPILOT_RESYNC_SECONDS", "inf"),
                                            ("LLM_AUTOPILOT_FULL_CHECK_SECONDS", "nan"),
                                            ("LLM_AUTOPILOT_PROMETHEUS_ROUND_SECONDS", "-1")])
def test_a_malformed_knob_is_refused_naming_it(key: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"^{key}='{value}': must be a (whole )?number >= ") as refused:
        OperatorSettings.from_env({key: value})
    assert "\n" not in str(refused.value)


def test_the_calibration_store_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "no-such-file"
    monkeypatch.setattr(settings, "SERVICE_ACCOUNT_NAMESPACE", outside)
    assert OperatorSettings.from_env({}).calibration_namespace is None  # outside a cluster: no store
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_CALIBRATION_NAMESPACE": "ops"}).calibration_namespace == "ops"
    outside.write_text("llm-autopilot\n")  # in a pod: its own namespace
    assert OperatorSettings.from_env({}).calibration_namespace == "llm-autopilot"
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_CALIBRATION_NAMESPACE": "off"}).calibration_namespace is None
