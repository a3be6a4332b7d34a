"""What a remediation step costs, with the compile cache off, cold and warm (issue #29, "Proof"). `make bench-steps`.

The setup of ``make bench-cache`` (tests/bench/bench_cache.py): the tiny model in the cluster's SeaweedFS with the
model cache, the real CPU vLLM on the vllm-cpu pool, an operator of its own in a namespace of its own, the nodes'
KV room at 4 MiB (8,192 tokens of 512 bytes; vLLM admits at most 8,064). Two steps, each three ways:

- ``kv``: the KV-capacity step, ``maxModelLen`` 16384 into that room -> a lower ``max_model_len`` (no pod ever
  served before it: the model is down until the new plan's pod is Ready);
- ``saturation``: the KV-saturation step of tests/e2e/test_model_cache.py, 24 clients of 1500 + 2000 tokens,
  ``kvSaturationWindowSeconds`` 30, ``maxReplicas`` 1 -> fewer ``max_num_seqs``, a surge onto the free node;

- ``off``: ``spec.vllm.compileCache.enabled: false`` and ``VLLM_CACHE_ROOT`` under the pod's own emptyDir HOME,
  so every pod compiles from scratch, as in a real cluster (the process kubelet otherwise gives every pod a
  node-wide VLLM_CACHE_ROOT, hack/localcluster/kubelet.py, a test-speed aid a real kubelet does not give);
- ``cold``: the compile cache on a fresh PVC (the model's compile PVC deleted first);
- ``warm``: the same step again on a second LLMDeployment of the same model, right after ``cold``: the plan after
  the step finds its compile entry on the PVC (written by the ``cold`` run's new pod).

For each: ``recoveredSeconds`` and ``servedThroughout`` from ``status.remediation.history[0]``; the seconds from
the evidence (a crash's ``finishedAt``, a saturation's ``observedAt``) to a pod of the new plan answering a
completion, as this bench saw it; the weight bytes GET from the store and downloaded from the Hub since the
evidence (as bench_cache counts them); and the answers and failures of a client asking once a second
(tests/e2e/real_vllm.py ``ClientLoop``, a look with no Ready pod is a failure) from the step seen in the status
until the new plan's pod has answered it 3 times. Prints, asserts nothing.

``python -m tests.bench.bench_steps kv`` (or ``saturation``, or single parts such as ``kv-off``; default all):
``warm`` follows its own ``cold`` in the same run (a ``warm`` alone finds no entry and says so in its row).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from llm_autopilot.render.compile_cache import COMPILE_CACHE_LABEL
from llm_autopilot.render.kubernetes import HOME_DIR
from tests.bench import bench_cache
from tests.e2e.conftest import CRD, Kubectl, _cluster_env, wait_for
from tests.e2e.model_store import PREFIX, Store, model_files
from tests.e2e.real_vllm import (
    MIB,
    START_SECONDS,
    ClientLoop,
    FollowingLoad,
    arg,
    history,
    operator_for,
    pods,
    wait_steps,
)

STEPS = ("kv", "saturation")
MODES = ("off", "cold", "warm")
#: what to measure (arguments; default all): a step (kv, saturation), a mode (off, cold, warm) or both (kv-off)
ARGS = set(sys.argv[1:])
PARTS = [(step, mode) for step in STEPS for mode in MODES
         if not ARGS or step in ARGS or mode in ARGS or f"{step}-{mode}" in ARGS]
#: kvSaturationWindowSeconds: the schema's least, as in test_model_cache.py
WINDOW = 30
#: the new plan's pod answers the client this often before the step's figures close
ANSWERS_FROM_NEW_POD = 3
MODE_LABEL = {"off": "off", "cold": "on-cold", "warm": "on-warm"}
STEP_LABEL = {"kv": "KV capacity", "saturation": "KV saturation"}


@dataclass(frozen=True)
class Row:
    step: str
    compile_cache: str
    recovered_seconds: str
    served_throughout: str
    evidence_to_serving: float
    store_bytes: int
    hub_bytes: int
    failed: int
    answered: int
    new_pod_log: str


ROWS: list[Row] = []


#: vLLM's log lines about its compile cache (vllm/compilation/decorators.py, 0.32.0) and its engine start
_WARMING_UP = re.compile(r"(\d\d:\d\d:\d\d) \[[^]]+\] Warming up model for the compilation")
_SAVED = re.compile(r"(\d\d:\d\d:\d\d) \[[^]]+\] \[backbone\] saved AOT compiled function")
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


def compile_summary(log: str) -> str:
    """What a vLLM pod's log says of its compile cache: the entry loaded, found but compiled again (the CPU
    build cannot load its own AOT artefact: docs/users/model-cache.md), or none; the compile's seconds (warm-up
    to the artefact saved, whole seconds as vLLM logs them) and the engine's init."""
    if "Directly load AOT compilation" in log:
        entry = "loaded"
    elif "due to a load failure" in log:
        entry = "found, compiled again"
    else:
        entry = "none"
    parts = [f"entry {entry}"]
    warming, saved = _WARMING_UP.search(log), _SAVED.search(log)
    if warming and saved:
        seconds = (datetime.strptime(saved.group(1), "%H:%M:%S") - datetime.strptime(warming.group(1), "%H:%M:%S"))
        parts.append(f"compile {seconds.total_seconds():.0f} s")
    if init := _INIT_ENGINE.search(log):
        parts.append(f"engine init {float(init.group(1)):.1f} s")
    return ", ".join(parts)


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Bench(bench_cache.Bench):
    """bench_cache's (the same store, model and operator; its apply, serving, byte counts, KV room) with the
    compile cache's modes."""

    def delete(self, name: str) -> None:
        self.k("delete", "llmd", name, "-n", self.namespace, "--wait=true", "--timeout=90s")
        wait_for(f"the pods of {name} to go", lambda: not pods(self.k, self.namespace, name), timeout=240)

    def compile_claims(self) -> list[str]:
        found = self.k.json("pvc", "-n", self.namespace, "-l", COMPILE_CACHE_LABEL)["items"]
        return [c["metadata"]["name"] for c in found]

    def forget_compile_cache(self) -> None:
        """The model's compile PVC deleted (no pod uses it now): the next pod gets a fresh one."""
        self.k("delete", "pvc", "-n", self.namespace, "-l", COMPILE_CACHE_LABEL, "--wait=true", "--timeout=120s")

    def spec(self, name: str, mode: str, **fields: Any) -> dict[str, Any]:
        if mode == "off":  # compiles in its own emptyDir HOME, as a pod of a real kubelet would
            vllm = {"compileCache": {"enabled": False},
                    "env": [{"name": "VLLM_CACHE_ROOT", "value": f"{HOME_DIR}/.cache/vllm"}]}
        else:
            vllm = {"compileCache": {"enabled": True}}
        return self.cached(name, vllm=vllm, **fields)

    def prepare(self, mode: str) -> str:
        """The compile cache as the mode needs it; the label's note when it is not what the mode says."""
        if mode == "cold":
            self.forget_compile_cache()
        if mode == "warm" and not self.compile_claims():
            return " (no PVC from a cold run: cold)"
        return ""

    def recovery(self, name: str) -> dict[str, Any]:
        """The step's history entry once its recovery is recorded (or superseded)."""
        found: dict[str, Any] = wait_for(f"{name}'s step to record its recovery", lambda: next(
            (s for s in history(self.k, self.namespace, name)[:1]
             if s.get("recoveredSeconds") is not None or s.get("superseded")), None), timeout=120, interval=2)
        return found

    def new_pod_log(self, pod: str) -> str:
        found = self.k("logs", pod, "-n", self.namespace, "-c", "vllm", check=False)
        return compile_summary(found.stdout) if found.returncode == 0 else "(no log)"

    def finish(self, step_kind: str, mode: str, note: str, name: str, step: dict[str, Any], evidence_at: float,
               served_at: float, loop: ClientLoop, before: tuple[int, int], pod: str) -> None:
        entry = self.recovery(name)
        recovered = entry.get("recoveredSeconds")
        served = entry.get("servedThroughout")
        found = Row(f"{STEP_LABEL[step_kind]}: {step['action']}", MODE_LABEL[mode] + note,
                    "superseded" if recovered is None else f"{recovered:.0f}", "-" if served is None else str(served),
                    served_at - evidence_at, self.store_bytes(evidence_at), self.hub_bytes(evidence_at),
                    loop.failed - before[1], loop.ok - before[0], self.new_pod_log(pod))
        ROWS.append(found)
        print(f"  {found} load average {os.getloadavg()[0]:.1f}; client by pod {loop.by_pod}; first errors "
              f"{loop.errors[:3]}", file=sys.stderr, flush=True)

    def answered_by(self, loop: ClientLoop, pod: str) -> None:
        wait_for(f"{ANSWERS_FROM_NEW_POD} answers from {pod}",
                 lambda: loop.by_pod.get(pod, 0) >= ANSWERS_FROM_NEW_POD, timeout=180, interval=1)

    def kv(self, mode: str) -> None:
        name = f"kv-{mode}"
        note = self.prepare(mode)
        self.apply(self.spec(name, mode, serving={"maxModelLen": 16384, "minMaxModelLen": 2048}))
        step = wait_steps(self.k, self.namespace, name, 1, 2 * START_SECONDS)[0]
        loop = ClientLoop(self.k, self.namespace, name).start()
        try:
            evidence_at = epoch(step["evidence"].get("finishedAt") or step["time"])
            pod = self.serving(name, where=lambda p: arg(p, "--max-model-len") != "16384")
            served_at = time.time()
            self.answered_by(loop, pod["metadata"]["name"])
        finally:
            loop.stop()
        self.finish("kv", mode, note, name, step, evidence_at, served_at, loop, (0, 0), pod["metadata"]["name"])
        self.delete(name)

    def saturation(self, mode: str) -> None:
        name = f"saturation-{mode}"
        note = self.prepare(mode)
        self.apply(self.spec(name, mode, serving={"maxModelLen": 4096, "allowedKVCacheDtypes": ["auto"]},
                             remediation={"kvSaturationWindowSeconds": WINDOW, "maxReplicas": 1,
                                          "stableWindowSeconds": 3600}))
        first = self.serving(name, where=lambda p: True)
        seqs = arg(first, "--max-num-seqs")
        # as test_model_cache.py's saturation test: the client loop first, then the load that saturates
        loop = ClientLoop(self.k, self.namespace, name).start()
        load = FollowingLoad(self.k, self.namespace, name, clients=24, prompt_tokens=1500, max_tokens=2000)
        try:
            step = wait_steps(self.k, self.namespace, name, 1, WINDOW + 2 * START_SECONDS, load=load)[0]
            before = loop.ok, loop.failed
            load.stop()  # two cores: a new vLLM cannot start beside an overloaded one; the client loop goes on
            evidence_at = epoch(step["evidence"].get("observedAt") or step["time"])
            pod = self.serving(name, where=lambda p: arg(p, "--max-num-seqs") != seqs)
            served_at = time.time()
            self.answered_by(loop, pod["metadata"]["name"])
        finally:
            load.stop()
            loop.stop()
        self.finish("saturation", mode, note, name, step, evidence_at, served_at, loop, before, pod["metadata"]["name"])
        self.delete(name)


def table(rows: list[Row]) -> str:
    header = ("step", "compile cache", "recoveredSeconds", "servedThroughout", "evidence -> serving s",
              "S3 bytes", "Hub bytes", "requests failed/answered", "the new pod's vLLM log")
    cells = [header, *((r.step, r.compile_cache, r.recovered_seconds, r.served_throughout,
                        f"{r.evidence_to_serving:.0f}", str(r.store_bytes), str(r.hub_bytes),
                        f"{r.failed}/{r.answered}", r.new_pod_log) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i in {0, 1, len(header) - 1} else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths, strict=True))) for row in cells)


def main() -> None:
    env = _cluster_env()
    k = Kubectl(env)
    k("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    namespace = f"bench-steps-{uuid.uuid4().hex[:6]}"
    store = Store(env, bucket=f"bench-steps-{uuid.uuid4().hex[:8]}").create()
    files = model_files()
    k("create", "namespace", namespace)
    bench = Bench(k, namespace, store, files)
    print(f"parts: {', '.join(f'{s}-{m}' for s, m in PARTS)}; namespace {namespace}", file=sys.stderr, flush=True)
    try:
        store.put_model(PREFIX, files)
        k("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(store.secret_manifest()))
        with operator_for(k, namespace, Path(tempfile.mkdtemp(prefix="bench-steps-"))):
            bench.set_kv_room(4 * MIB)
            try:
                for step, mode in PARTS:
                    print(f"{step}-{mode}: {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
                    getattr(bench, step)(mode)
            finally:
                bench.set_kv_room(None)
    finally:
        k("delete", "llmd", "--all", "-n", namespace, "--wait=false", check=False)
        k("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)
        store.remove()
        print(table(ROWS))


if __name__ == "__main__":
    main()
