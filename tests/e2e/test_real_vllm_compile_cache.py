"""The compile cache on a real vLLM (the CPU build on the vllm-cpu pool): the same pod spec started twice with
spec.vllm.compileCache, first cold, then (the first pod deleted) warm, without enforceEager, so vLLM compiles the
model with torch.compile.

What the test asserts is what the CPU build shows: the first pod compiles (its log says so), writes vLLM's cache
into the operator's PVC under the key's folder, and the second pod runs with the same folder, past the
kubelet's node-wide VLLM_CACHE_ROOT. Whether the second start reuses the compiled graph is reported, with the
log lines and both start times, not asserted: see docs/users/model-cache.md, "Compile cache" (the CPU build
0.32.0 writes an AOT artefact each start and cannot load it back).
"""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Kubectl, wait_for
from tests.e2e.real_vllm import (
    START_SECONDS,
    apply,
    complete,
    llmd,
    operator_for,
    pods,
    ready_pods,
    real_vllm_fixture,  # noqa: F401 - a fixture
    tiny,
)

pytestmark = [pytest.mark.e2e, pytest.mark.real_vllm, pytest.mark.usefixtures("real_vllm")]
NAME = "compiled"
#: what vLLM logs about torch.compile and its cache (vllm/compilation/*.py)
COMPILE_LINES = re.compile(r"torch\.compile|Compiling a graph|Directly load|compil.* cache|AOT|load failure|"
                           r"Compiling model again|Dynamo bytecode transform|init engine")


def report(scenario: str, **figures: Any) -> None:
    sys.stderr.write(f"\n[compile cache] {scenario}: " + "; ".join(f"{k}={v}" for k, v in figures.items()) + "\n")


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def start_seconds(pod: dict[str, Any]) -> float:
    """From the vLLM container's start to the pod's Ready condition (the kubelet's own timestamps)."""
    started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
    return _stamp(ready) - _stamp(started)


def compile_lines(kubectl: Kubectl, namespace: str, pod: str) -> list[str]:
    log = kubectl("logs", "-n", namespace, pod, "-c", "vllm").stdout
    return [line.strip()[-300:] for line in log.splitlines() if COMPILE_LINES.search(line)]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def test_a_second_pod_runs_on_the_first_ones_compile_cache(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    spec: dict[str, Any] = {"vllm": {"compileCache": {"enabled": True, "size": "1Gi"}},
                            "remediation": {"enabled": False}}
    with operator_for(kubectl, namespace, tmp_path):
        apply(kubectl, namespace, tiny(NAME, **spec))
        first: dict[str, Any] = wait_for("a Ready vLLM", lambda: next(iter(ready_pods(kubectl, namespace, NAME)),
                                                                       None), timeout=START_SECONDS, interval=2)
        assert complete(first)["usage"]["completion_tokens"] == 8
        status = llmd(kubectl, namespace, NAME)["status"]["compileCache"]
        claim, folder = status["claimName"], status["folder"]
        env = env_of(first)
        # the pod's own VLLM_CACHE_ROOT, into the PVC: not the kubelet's node-wide one
        assert env["VLLM_CACHE_ROOT"] == f"/compile-cache/{folder}/vllm", env
        assert "--enforce-eager" not in first["spec"]["containers"][0]["args"]
        cold_lines = compile_lines(kubectl, namespace, first["metadata"]["name"])
        cold = start_seconds(first)
        report("cold start", pod=first["metadata"]["name"], seconds=round(cold, 1), lines=cold_lines)
        # the CPU build compiles with torch.compile (vllm/platforms/cpu.py: Dynamo traced once, the inductor backend,
        # torch's AOT compile; vLLM's "Starting torch.compile" line is only logged in its own VLLM_COMPILE mode) and
        # saves the compiled function into the pod's VLLM_CACHE_ROOT, on the PVC
        saved = f"saved AOT compiled function to /compile-cache/{folder}/vllm/torch_compile_cache/torch_aot_compile/"
        assert any(saved in line for line in cold_lines), cold_lines

        volume = kubectl.json("pvc", claim, "-n", namespace)["spec"]["volumeName"]
        root = Path(kubectl.json("pv", volume)["spec"]["hostPath"]["path"]) / folder / "vllm" / "torch_compile_cache"
        written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        artefacts = sorted(root.glob("torch_aot_compile/*/rank_0_0/model"))
        assert artefacts, f"no AOT artefact under {root}: {written[:10]}"
        cold_mtime = artefacts[0].stat().st_mtime
        report("written", root=str(root), files=len(written), artefact=str(artefacts[0].relative_to(root)),
               bytes=artefacts[0].stat().st_size)

        kubectl("delete", "pod", "-n", namespace, first["metadata"]["name"], "--wait=false")

        def second_ready() -> dict[str, Any] | None:
            return next((p for p in ready_pods(kubectl, namespace, NAME)
                         if p["metadata"]["name"] != first["metadata"]["name"]), None)

        second = wait_for("the second pod Ready", second_ready, timeout=START_SECONDS, interval=2)
        assert complete(second)["usage"]["completion_tokens"] == 8
        assert env_of(second)["VLLM_CACHE_ROOT"] == env["VLLM_CACHE_ROOT"]
        warm_lines = compile_lines(kubectl, namespace, second["metadata"]["name"])
        warm = start_seconds(second)
        report("second start", pod=second["metadata"]["name"], node=second["spec"].get("nodeName"),
               seconds=round(warm, 1), lines=warm_lines)
        # the second pod read the same folder: the artefacts its log names are those under the key
        assert any(f"/compile-cache/{folder}/vllm/" in line for line in warm_lines), warm_lines
        loaded = any("Directly load AOT compilation" in line for line in warm_lines)
        rewritten = artefacts[0].stat().st_mtime != cold_mtime
        report("compared", cold_seconds=round(cold, 1), warm_seconds=round(warm, 1), loaded_from_cache=loaded,
               artefact_rewritten=rewritten, pods_left=len(pods(kubectl, namespace, NAME)))
