#!/usr/bin/env python3
"""`make demo`: watch the operator roll vLLM to a safer rung after an OOM, and explain why.

Runs `make dev`'s setup (cluster, operator, examples/qwen3-8b-l4.yaml in namespace `demo`), then writes an
OOMKilled termination into the vLLM pod's status exactly as the kubelet would after a host-memory kill,
waits for the operator to react, and shows the new memory limit, the remediation history and the Events.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import dev


def step(message: str) -> None:
    print(f"\n=== {message}", flush=True)


def main() -> int:
    if dev.up() != 0:
        return 1
    env = dev.cluster_env()

    def get(*args: str) -> dict:  # type: ignore[type-arg]
        return json.loads(dev.kubectl(env, "get", *args, "-n", dev.NAMESPACE, "-o", "json", capture=True))

    pods = [p for p in get("pods", "-l", "app.kubernetes.io/instance=qwen3-8b")["items"]
            if p["status"].get("phase") == "Running"]
    if not pods:
        print("no Running vLLM pod in namespace demo", file=sys.stderr)
        return 1
    pod = pods[0]
    limit = get("deployment", "qwen3-8b")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    step(f"1. vLLM runs in {pod['metadata']['name']} with a memory limit of {limit['memory']}")
    rung_before = (get("llmd", "qwen3-8b").get("status", {}).get("remediation") or {}).get("rung", 0)

    step("2. The host kills the container for exceeding its memory (written as the kubelet does: OOMKilled, 137)")
    status = pod["status"]["containerStatuses"][0]
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status.update(restartCount=int(status.get("restartCount", 0)) + 1, lastState={"terminated": {
        "reason": "OOMKilled", "exitCode": 137, "startedAt": stamp, "finishedAt": stamp}})
    dev.kubectl(env, "patch", "pod", pod["metadata"]["name"], "-n", dev.NAMESPACE, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": {"containerStatuses": [status]}}), capture=True)

    step("3. The operator reads the evidence, asks the planner for the next rung and rolls the pods")
    started = time.monotonic()
    while time.monotonic() - started < 90:
        remediation = get("llmd", "qwen3-8b").get("status", {}).get("remediation") or {}
        if remediation.get("rung", 0) > rung_before:
            break
        time.sleep(1)
    else:
        print("the operator did not react within 90 s; see the operator log", file=sys.stderr)
        return 1
    new_limit = get("deployment", "qwen3-8b")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    print(f"reacted after {time.monotonic() - started:.1f} s: memory limit {limit['memory']} -> {new_limit['memory']}")
    last = remediation["history"][-1]
    print(f"rung {remediation['rung']}: {last['message']}")
    print("evidence: " + ", ".join(f"{k}={v}" for k, v in last["evidence"].items() if v))

    step("4. kubectl describe llmd qwen3-8b -n demo (status and events)")
    described = dev.kubectl(env, "describe", "llmd", "qwen3-8b", "-n", dev.NAMESPACE, capture=True)
    keep = False
    for line in described.splitlines():
        if line.strip().startswith(("Conditions:", "Remediation:", "Events:")):
            keep = True
        if keep:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
