"""The after-plan features' shell, one module each: its ``READERS`` (its asks' types, each to the function that
reads it into the feature's reading) and its ``EXECUTORS`` (its effects' types, each to what the shell does once
the objects are written). controller/reconcile.py assembles its tables from FEATURES: a new feature is its module
here and its line below, beside its section in desired/sections/ and its line in desired/pipeline.py."""

from __future__ import annotations

from types import ModuleType

from llm_autopilot.controller.features import burn_in, canary, lora, network_policy, remediation_adoption, startup_probe

FEATURES: tuple[ModuleType, ...] = (burn_in, canary, lora, network_policy, remediation_adoption, startup_probe)
