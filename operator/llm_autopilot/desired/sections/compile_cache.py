"""Section: status.compileCache -- the PVC and folder the plan's pods keep vLLM's compile caches in -- and the PVC
to create while it is missing (render/compile_cache.py)."""

from __future__ import annotations

from typing import Any

from llm_autopilot.desired.planning import Rendered
from llm_autopilot.desired.status_fields import COMPILE_CACHE
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.render import compile_cache


def objects(d: Draft, final: Rendered) -> list[dict[str, Any]]:
    """The compile cache's PVC (written only while missing: its input hash is its name's), none when it is off."""
    volume = final.inputs.compile_cache
    return [] if volume is None else [compile_cache.pvc(volume, d.owner.namespace)]


def report_compile_cache(d: Draft, final: Rendered) -> None:
    """status.compileCache of the plan rendered; absent when the compile cache is off."""
    volume = final.inputs.compile_cache
    if volume is not None:
        d.put(COMPILE_CACHE, volume.status())
