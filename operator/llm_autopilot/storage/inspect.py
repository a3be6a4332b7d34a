"""Inspect a model folder on a mounted volume: what the planner needs, as one compact JSON report.

Run by the inspect Job of a pvc:// source (``llm-autopilot inspect-volume /model/<path>``), with the claim
mounted read-only. It reads config.json (and hf_quant_config.json, as the Hub client does), checks that
config.json describes a model the planner can plan for, and sizes the weights from the files on the volume:
the ``*.safetensors`` files' bytes; with a ``model.safetensors.index.json``, every shard it names must be there
(a partial copy is an error, never planned on). The report goes to the termination message (api/inspection.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llm_autopilot.api.inspection import (
    MESSAGE_LIMIT,
    REPORT_VERSION,
    InspectionFailure,
    InspectionReport,
    encode,
)
from llm_autopilot.catalog.hf_config import ModelConfigError, parse_hf_config, planner_view
from llm_autopilot.hub.client import _with_modelopt  # the one rule for ModelOpt's hf_quant_config.json

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
MODELOPT = "hf_quant_config.json"
#: a config.json is a few KiB; anything this large is not one
JSON_LIMIT = 4 * 2**20


class InspectError(RuntimeError):
    """The folder does not hold a model the operator can plan for; the message says what is wrong."""


def _json(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > JSON_LIMIT:
            raise InspectError(f"{path} is {size} bytes, too large for a {path.name}")
        value = json.loads(path.read_bytes())
    except InspectError:
        raise
    except PermissionError:
        raise InspectError(f"{path} is not readable (permission denied); make it world-readable (chmod a+r), "
                           "the inspection runs as a non-root user") from None
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InspectError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InspectError(f"{path} is not a JSON object")
    return value


def inspect_folder(folder: Path) -> InspectionReport:
    """The report on ``folder``; raises InspectError."""
    if not folder.exists():
        raise InspectError(f"{folder} does not exist on the volume")
    if not folder.is_dir():
        raise InspectError(f"{folder} is not a folder")
    config_path = folder / CONFIG
    if not config_path.is_file():
        raise InspectError(f"no {CONFIG} in {folder}: the path must be the model's folder (the one holding "
                           f"{CONFIG} and the *.safetensors files)")
    modelopt_path = folder / MODELOPT
    config = _with_modelopt(_json(config_path), _json(modelopt_path) if modelopt_path.is_file() else None)
    view = planner_view(config)
    try:
        parse_hf_config(view, str(folder))
    except ModelConfigError as exc:
        raise InspectError(f"{config_path}: {exc}") from None
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.is_file())
    except OSError as exc:
        raise InspectError(f"cannot list {folder}: {exc.strerror or exc}") from None
    weights = [n for n in names if n.endswith(".safetensors")]
    index_path = folder / INDEX
    if index_path.is_file():
        weight_map = _json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise InspectError(f"{index_path} has no weight_map")
        missing = sorted({str(s) for s in weight_map.values()} - set(weights))
        if missing:
            raise InspectError(f"{index_path} names {len(missing)} shard(s) that are not in {folder} (a partial "
                               f"copy?): {', '.join(missing[:3])}")
    if not weights:
        raise InspectError(f"no *.safetensors weights in {folder}")
    total = sum((folder / n).stat().st_size for n in weights)
    report = InspectionReport(report=REPORT_VERSION, ok=True, config=view, checkpoint_bytes=total or None,
                              weight_files=len(weights), files=len(names))
    if len(encode(report).encode()) > MESSAGE_LIMIT:
        raise InspectError(f"{config_path}'s planner fields take more than the {MESSAGE_LIMIT} bytes of a "
                           "termination message; describe the model in spec.model.architecture instead")
    return report


def failure(message: str) -> InspectionFailure:
    text = " ".join(message.split())
    return InspectionFailure(report=REPORT_VERSION, ok=False, error=text[:2000] or "inspection failed")
