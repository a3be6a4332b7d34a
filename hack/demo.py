#!/usr/bin/env python3
"""`make demo`: a real vLLM does not fit its KV cache, and the operator lowers max_model_len to what vLLM says.

Runs `make dev`'s setup (cluster, operator, webhook), installs the CPU build of vLLM and its tiny models (cached
after the first run), gives the vllm-cpu pool a 4 MiB KV room (8,192 tokens) and applies
examples/tiny-llama-vllm-cpu.yaml, which asks for max_model_len 16384. Then it shows what happens, as a
platform engineer would see it: vLLM's start-up failure (the root cause in `kubectl logs --previous`, not in
the 2 KiB termination message), the operator's step to vLLM's own estimate, the new pod serving a completion,
and `kubectl describe llmd`; then the plan checked against vLLM's own KV figures (status.verification), a
second deployment planned with the calibration the first one's figures gave (status.kvCalibration), and a
burn-in before traffic that finds a KV room too small for the plan's concurrency and has remediation act before
the pod is ever Ready (status.burnIn, BurnInPassed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import dev

NAME = "tiny-llama"
EXAMPLE = dev.ROOT / "examples" / "tiny-llama-vllm-cpu.yaml"
KV_ROOM = 4 * 2**20
KV_ANNOTATION = "llm-autopilot.io/kv-cache-memory-bytes"
POOL = "llm-autopilot.io/node-pool=vllm-cpu"


def step(message: str) -> None:
    print(f"\n=== {message}", flush=True)


def wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(2)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}; see the operator log and "
                     "`kubectl describe llmd -n demo`")


def main() -> int:
    step("0. the CPU build of vLLM and its tiny models (installed once: about 5-8 minutes)")
    subprocess.run([*dev.CLUSTER, "vllm", "models"], check=True, stdout=subprocess.DEVNULL)
    if dev.up() != 0:
        return 1
    env = dev.cluster_env()

    def kubectl(*args: str) -> str:
        return dev.kubectl(env, *args, capture=True)

    def get(*args: str) -> dict[str, Any]:
        return json.loads(kubectl("get", *args, "-n", dev.NAMESPACE, "-o", "json"))

    def pods() -> list[dict[str, Any]]:
        return get("pods", "-l", f"app.kubernetes.io/instance={NAME}")["items"]

    step("1. the vllm-cpu pool's real KV room shrinks to 4 MiB (8,192 tokens) while the planner believes its GPU "
         "has room for much more: the situation remediation exists for")
    kubectl("annotate", "nodes", "-l", POOL, f"{KV_ANNOTATION}={KV_ROOM}", "--overwrite")
    kubectl("delete", "llmd", NAME, "-n", dev.NAMESPACE, "--ignore-not-found", "--wait=true")
    kubectl("apply", "-n", dev.NAMESPACE, "-f", str(EXAMPLE))
    plan = wait("the plan", lambda: get("llmd", NAME).get("status", {}).get("plan"), 60)
    print(f"planned: max_model_len {plan['maxModelLen']} on {plan['summary']}; "
          f"vllm serve {' '.join(plan['args'])}")

    step("2. vLLM starts (about a minute on 2 cores) and refuses: the KV cache cannot hold one 16384-token request")
    started = time.monotonic()
    crashed = wait("vLLM's first exit", lambda: next(
        (p for p in pods() for s in p["status"].get("containerStatuses") or [] if s.get("lastState", {}).get(
            "terminated")), None), 600)
    terminated = crashed["status"]["containerStatuses"][0]["lastState"]["terminated"]
    message = terminated.get("message", "")
    print(f"{crashed['metadata']['name']} exited {terminated['exitCode']} after {time.monotonic() - started:.0f}s")
    print(f"termination message (the kubelet's last 2 KiB): ...{message[-160:].strip()!r}")
    print(f"  contains the root cause? {'estimated maximum model length' in message}")
    previous = kubectl("logs", crashed["metadata"]["name"], "-n", dev.NAMESPACE, "--previous")
    root = next((line for line in previous.splitlines() if "estimated maximum model length" in line), "")
    print(f"kubectl logs --previous: {root.strip()[:260]}")

    step("3. the operator reads the previous log, takes vLLM's own estimate and rolls a safer plan")
    history = wait("the remediation step", lambda: (get("llmd", NAME).get("status", {}).get("remediation") or {})
                   .get("history"), 300)
    last = history[-1]
    print(f"rung {last['rung']} ({last['signal']}): {last['message']}")
    print(f"evidence ({last['evidence'].get('source', '')}): {last['evidence'].get('message', '')[:260]}")

    step("4. the new pod starts and serves")
    ready = wait("a Ready pod", lambda: next(
        (p for p in pods() if any(c.get("type") == "Ready" and c.get("status") == "True"
                                  for c in p["status"].get("conditions") or [])), None), 600)
    args = ready["spec"]["containers"][0]["args"]
    print(f"{ready['metadata']['name']} Ready with --max-model-len {args[args.index('--max-model-len') + 1]}, "
          f"{time.monotonic() - started:.0f}s after the first start")
    body = json.dumps({"model": "llm-autopilot/tiny-llama-gqa", "prompt": "The operator", "max_tokens": 8})
    request = urllib.request.Request(f"http://{ready['status']['podIP']}:8000/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        completion = json.load(response)
    print(f"completion: {completion['choices'][0]['text']!r} ({completion['usage']['completion_tokens']} tokens)")

    step(f"5. kubectl describe llmd {NAME} -n {dev.NAMESPACE} (status and events)")
    keep = False
    for line in kubectl("describe", "llmd", NAME, "-n", dev.NAMESPACE).splitlines():
        if line.startswith(("Status:", "Events:")):
            keep = True
        if keep:
            print(line)
    verification(get, NAME)
    calibration(kubectl, get)
    burn_in(kubectl, get)
    print(f"\nThe pool keeps a KV room of its own; `kubectl annotate nodes -l {POOL} {KV_ANNOTATION}-` restores it. "
          "`make down` stops everything.")
    return 0


def verification(get: Any, name: str) -> dict[str, Any]:
    """Step 6: the serving plan checked against vLLM's own KV figures (status.verification, PlanVerified)."""
    step(f"6. the plan checked against the running vLLM: status.verification of {name}")
    found = wait(f"status.verification of {name} (vLLM starts in about a minute)",
                 lambda: get("llmd", name).get("status", {}).get("verification"), 600)
    print(f"vLLM {found['vllmVersion']} ({found['source']}): {found.get('actualTokens')} tokens of KV cache, "
          f"{found['actualKVGiB']} GiB; the plan predicted {found['predictedTokens']} tokens, "
          f"{found['predictedKVGiB']} GiB: {found['errorPercent']:+.2f} % of GPU memory "
          f"(tolerance ±{found['tolerancePercent']:g} %), verified {found['verified']}")
    condition = next(c for c in get("llmd", name)["status"]["conditions"] if c["type"] == "PlanVerified")
    print(f"PlanVerified={condition['status']} ({condition['reason']})")
    return dict(found)


def calibration(kubectl: Any, get: Any) -> None:
    """Step 7: a room 6 % short of the plan; the first deployment's figures calibrate the second's plan."""
    step("7. calibration: the pool's real KV room is 6 % short of what the planner counts; a first deployment "
         "measures it, a second one of the same model on the same pool is planned with it")
    first, second, block = "tiny-first", "tiny-second", 128
    for name in (NAME, first, second):  # the pool has two GPUs: the first demo's deployment makes room
        kubectl("delete", "llmd", name, "-n", dev.NAMESPACE, "--ignore-not-found", "--wait=true")
    # an empty store, as on a new cluster (an earlier run's samples would calibrate the first deployment too);
    # `make dev`'s operator reads it again every 5 s
    kubectl("delete", "configmap", "llm-autopilot-calibration", "-n", "default", "--ignore-not-found")
    time.sleep(6)
    example = json.loads(kubectl("create", "--dry-run=client", "-o", "json", "-f", str(EXAMPLE)))

    def apply(name: str, replicas: int) -> None:
        spec = {**example["spec"], "replicas": replicas, "serving": {"maxModelLen": 2048},
                "vllm": {**example["spec"]["vllm"], "gpuMemoryUtilization": 0.6}}  # a small room, a small cache
        body = {**example, "metadata": {"name": name, "namespace": dev.NAMESPACE}, "spec": spec}
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(body, f)
            f.flush()
            kubectl("apply", "-f", f.name)

    apply(first, 0)
    plan = wait("the first plan", lambda: get("llmd", first).get("status", {}).get("plan"), 60)
    # 512 bytes a token; half a block past a block boundary, away from the ratio's rounding
    room = int(plan["memory"]["kvCacheTokens"] * 0.94) // block * block * 512 + block * 256
    kubectl("annotate", "nodes", "-l", POOL, f"{KV_ANNOTATION}={room}", "--overwrite")
    print(f"{first}: planned {plan['memory']['kvCacheTokens']} KV tokens; the pool's vLLM gets {room // 512}")
    apply(first, 1)
    measured = verification(get, first)
    kept = wait("the sample in ConfigMap default/llm-autopilot-calibration", lambda: _sample(kubectl, first), 120)
    print(f"calibration store (ConfigMap default/llm-autopilot-calibration): {json.dumps(kept)}")
    apply(second, 1)
    pin = wait("the second plan's calibration", lambda: (get("llmd", second).get("status", {}).get(
        "kvCalibration") or {}).get("ratio") and get("llmd", second)["status"]["kvCalibration"], 60)
    print(f"{second} status.kvCalibration: {pin['message']}")
    calibrated = verification(get, second)
    within = abs(calibrated["predictedTokens"] - (calibrated.get("actualTokens") or 0)) <= block
    print(f"first: {measured['predictedTokens']} tokens predicted, {measured.get('actualTokens')} in vLLM; second "
          f"(calibrated): {calibrated['predictedTokens']} predicted, {calibrated.get('actualTokens')} in vLLM "
          f"(within one block of {block} tokens: {within})")


def burn_in(kubectl: Any, get: Any) -> None:
    """Step 8: the plan holds 8 requests of 2,048 tokens; the pool's real KV room holds 4. The burn-in (a readiness
    gate) loads each new pod on its own IP before any Service sends it traffic; its failure is remediation's
    evidence, and the ladder steps until a plan's burn-in passes."""
    step("8. burn-in before traffic: the plan expects 8 concurrent requests of 2,048 tokens, the pool's real KV "
         "room holds 4; each new pod is loaded on its own IP before it may be Ready")
    name = "tiny-burn-in"
    for other in ("tiny-first", "tiny-second", name):  # the pool's two GPUs
        kubectl("delete", "llmd", other, "-n", dev.NAMESPACE, "--ignore-not-found", "--wait=true")
    kubectl("annotate", "nodes", "-l", POOL, f"{KV_ANNOTATION}={4 * 2048 * 512}", "--overwrite")
    example = json.loads(kubectl("create", "--dry-run=client", "-o", "json", "-f", str(EXAMPLE)))
    spec = {**example["spec"], "serving": {"maxModelLen": 2048, "expectedConcurrency": 8},
            "vllm": {**example["spec"]["vllm"], "gpuMemoryUtilization": 0.6},
            # max_num_seqs may go down to 2: a burn-in of 2 requests fits the room
            "remediation": {"cooldownSeconds": 0, "floors": {"minMaxNumSeqs": 2}},
            # outputs long enough that the first request still runs when the last one is prefilled
            "verification": {"burnIn": {"maxTokens": 64, "timeoutSeconds": 240}}}
    body = {**example, "metadata": {"name": name, "namespace": dev.NAMESPACE}, "spec": spec}
    print(f"spec.verification: {json.dumps(spec['verification'])}")
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(body, f)
        f.flush()
        kubectl("apply", "-f", f.name)
    started = time.monotonic()
    first = wait("a remediation step on the burn-in's evidence (vLLM starts in about a minute)", lambda: (
        (get("llmd", name).get("status", {}).get("remediation") or {}).get("history") or [None])[0], 900)
    evidence = first["evidence"]
    print(f"rung {first['rung']} ({first['signal']}, evidence from the {evidence.get('source')}): {first['message']}")
    print("vLLM's own figures: " + ", ".join(f"{key} {evidence.get(key)}" for key in (
        "requests", "peakRunning", "peakWaiting", "peakUsage", "preemptions", "fullWhileWaiting", "wallSeconds")))
    print("that pod was never Ready: its readiness gate llm-autopilot.io/burn-in stayed False, so no Service "
          "sent it traffic")

    def passed() -> dict[str, Any] | None:
        status = get("llmd", name).get("status", {})
        found = next((c for c in status.get("conditions") or [] if c["type"] == "BurnInPassed"), None)
        return found if found and found["status"] == "True" else None

    verdict = wait("BurnInPassed=True (each step is a new pod and a new burn-in)", passed, 1800)
    history = get("llmd", name)["status"]["remediation"]["history"]
    print(f"{len(history)} step(s): {'; '.join(h['action'] for h in history)}")
    print(f"BurnInPassed=True after {time.monotonic() - started:.0f}s: {verdict['message']}")


def _sample(kubectl: Any, name: str) -> dict[str, Any] | None:
    """The deployment's sample in the operator's calibration store (`make dev` keeps it in default)."""
    try:
        found = json.loads(kubectl("get", "configmap", "llm-autopilot-calibration", "-n", "default", "-o", "json"))
    except subprocess.CalledProcessError:  # not written yet
        return None
    store = json.loads(found["data"]["calibration.json"])
    sample: dict[str, Any] | None = next((s for e in store["entries"] for s in e["samples"]
                                          if s["deployment"] == f"{dev.NAMESPACE}/{name}"), None)
    return sample


if __name__ == "__main__":
    sys.exit(main())
