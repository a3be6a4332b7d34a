"""Scale: N LLMDeployments on one operator replica, on the local cluster. `make bench-scale N=1000`.

Creates N LLMDeployments (copies of the examples, spread over the simulated GPU pools; every tenth has a
replica, the rest 0) in 20 namespaces, with the operator's admission webhook in the path as the Helm chart
configures it, and prints:

- the time from the first create until all are Planned, and p50/p99 of creation -> Planned per object;
- the operator's RSS at rest and its peak;
- the CPU seconds of the operator and of the API server in a quiet period (default 5 minutes), and the API
  writes in it (the API server's own request counters, by resource, and the operator's write counter);
- an operator restart with N objects present: the time until every object has been checked, and the writes;
- the webhook's latency (p50/p99) while 20 applies per second arrive and the N objects resync, measured by
  direct AdmissionReview POSTs and as the API server's round trip of a server-side dry-run create;
- the deletion time of all N (the LLMDeployments, and their Deployments, Services and PodDisruptionBudgets).

Figures only; it asserts nothing. Settings (environment): N (or the first argument), RESYNC (the operator's
resync interval; default its own default), QUIET_SECONDS (300), CREATE_RATE (creates per second, 20),
APPLY_RATE (20), NAMESPACES (20), REPLICA_EVERY (10). The cluster's Service range must hold N Services
(`LLM_AUTOPILOT_SERVICE_CIDR`, hack/README.md). The operator's log is kept in a temporary directory.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hack.localcluster.api import Api
from hack.localcluster.state import Cluster

from tests.e2e.conftest import CRD, _cluster_env, _free_port, listening

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GROUP_PATH = "/apis/llm-autopilot.io/v1alpha1"
BENCH_LABEL = "llm-autopilot.io/bench"
NAMESPACE_PREFIX = "bench-scale-"
WEBHOOK_NAME = "bench-scale.llm-autopilot.io"
WEBHOOK_PATH = "/validate-llmdeployment"
#: the operator writes these (the API server's request counters are per resource, not per client)
OPERATOR_RESOURCES = ("llmdeployments", "deployments", "services", "poddisruptionbudgets")
WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def setting(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def say(message: str) -> None:
    print(f"[bench-scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ---- processes --------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime (fields 14 and 15)


def memory_mib(pid: int, key: str) -> float:
    """VmRSS (resident now) or VmHWM (the peak) of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class OperatorProcess:
    """`llm-autopilot operator` without --verbose (debug logging would be most of its CPU), its own log."""

    def __init__(self, env: dict[str, str], log: Path, verbose: bool = False) -> None:
        self.env, self.log, self.verbose = env, log, verbose
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "llm_autopilot.cli.main", "operator",
                                             *(["--verbose"] if self.verbose else [])],
                                            env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"the operator exited; log {self.log}:\n{tail}")
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


# ---- metrics ----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            yield dict(_LABEL.findall(match.group(2) or "")), float(match.group(3))


def total(text: str, name: str, **wanted: str | tuple[str, ...]) -> float:
    def matches(labels: dict[str, str]) -> bool:
        return all(labels.get(k) in (v if isinstance(v, tuple) else (v,)) for k, v in wanted.items())
    return sum(value for labels, value in samples(text, name) if matches(labels))


def apiserver_writes(api: Api) -> dict[str, float]:
    """Writes (not dry runs) the API server counted, per resource the operator writes. The children's status
    is left out: the controller-manager writes it (e.g. a Deployment's ProgressDeadlineExceeded, 600 s after
    its creation, for the replicas no GPU is left for), never the operator."""
    text = api_metrics(api)
    return {r: total(text, "apiserver_request_total", verb=WRITE_VERBS, resource=r, dry_run="",
                     **({} if r == "llmdeployments" else {"subresource": ""}))
            for r in OPERATOR_RESOURCES}


def api_metrics(api: Api) -> str:
    _, body = api.request("GET", "/metrics", timeout=30)
    return body if isinstance(body, str) else ""


def operator_metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def webhook_histogram(api: Api) -> dict[float, float]:
    """The API server's cumulative webhook latency buckets for our webhook (upper bound -> count)."""
    buckets: dict[float, float] = {}
    for labels, value in samples(api_metrics(api), "apiserver_admission_webhook_admission_duration_seconds_bucket"):
        if labels.get("name") == f"validate-llmdeployment.{WEBHOOK_NAME}":
            bound = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """Prometheus' histogram_quantile over the difference of two scrapes (linear within a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank, previous_bound, previous_count = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / max(count - previous_count,
                                                                                              1e-9)
        previous_bound, previous_count = bound, count
    return bounds[-1]


# ---- the objects ------------------------------------------------------------------------------------------

def templates() -> list[dict[str, Any]]:
    """Specs spread over the GPU pools: Qwen3-8B on L4, Llama-3.1-70B on H100, Qwen3-30B-A3B on A100, and
    Qwen3-4B with no product (pool discovery)."""
    found = [yaml.safe_load((EXAMPLES / name).read_text())["spec"]
             for name in ("qwen3-8b-l4.yaml", "llama-3.1-70b-h100.yaml", "qwen3-30b-a3b-a100.yaml")]
    found.append({"model": {"name": "Qwen/Qwen3-4B"}, "serving": {"maxModelLen": 16384},
                  "gpu": {"tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}})
    return found


def manifest(i: int, namespaces: int, replica_every: int, specs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    spec = json.loads(json.dumps(specs[i % len(specs)]))
    spec["replicas"] = 1 if replica_every and i % replica_every == 0 else 0
    namespace = f"{NAMESPACE_PREFIX}{i % namespaces:02d}"
    return namespace, {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment",
                       "metadata": {"name": f"llm-{i:05d}", "namespace": namespace, "labels": {BENCH_LABEL: "scale"}},
                       "spec": spec}


def webhook_configuration(port: int, ca: bytes) -> dict[str, Any]:
    """What the Helm chart installs (creations and spec changes only), for the bench's namespaces."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [{
            "name": f"validate-llmdeployment.{WEBHOOK_NAME}", "sideEffects": "None", "failurePolicy": "Fail",
            "matchPolicy": "Equivalent", "timeoutSeconds": 30, "admissionReviewVersions": ["v1", "v1beta1"],
            "namespaceSelector": {"matchLabels": {BENCH_LABEL: "scale"}},
            "rules": [{"apiGroups": ["llm-autopilot.io"], "apiVersions": ["v1alpha1"],
                       "resources": ["llmdeployments"], "operations": ["CREATE", "UPDATE"], "scope": "*"}],
            "matchConditions": [{"name": "spec-changed", "expression": "request.operation == 'CREATE' || "
                                 "!has(oldObject.spec) || object.spec != oldObject.spec"}],
            "clientConfig": {"url": f"https://127.0.0.1:{port}{WEBHOOK_PATH}",
                             "caBundle": base64.b64encode(ca).decode()},
        }],
    }


def count(api: Api, path: str) -> int:
    """How many objects a list returns, from one item and remainingItemCount (no selector: it is not set then)."""
    code, body = api.request("GET", f"{path}?limit=1", timeout=30)
    if code != 200 or not isinstance(body, dict):
        raise RuntimeError(f"GET {path}: {code} {body}")
    return len(body.get("items") or []) + int(body.get("metadata", {}).get("remainingItemCount") or 0)


CHILD_PATHS = {"deployments": "/apis/apps/v1/deployments", "services": "/api/v1/services",
               "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets"}


# ---- the watch: when each object became Planned ------------------------------------------------------------

@dataclass
class PlannedWatch:
    """Watches the bench's LLMDeployments and notes when each first showed Planned=True."""

    cluster: Cluster
    planned: dict[str, float] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def _connection(self) -> http.client.HTTPSConnection:
        ctx = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.cluster.pki / "admin.crt"), str(self.cluster.pki / "admin.key"))
        host = urllib.parse.urlparse(self.cluster.server)
        return http.client.HTTPSConnection(host.hostname or "127.0.0.1", host.port, context=ctx, timeout=600)

    def _note(self, obj: dict[str, Any], at: float) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Planned":
                if c.get("status") == "True":
                    self.planned.setdefault(key, at)
                    self.refused.pop(key, None)
                elif key not in self.planned:
                    self.refused[key] = f"{c.get('reason')}: {str(c.get('message'))[:200]}"

    def run(self) -> None:
        selector = urllib.parse.quote(f"{BENCH_LABEL}=scale")
        while not self.stop.is_set():
            try:
                conn = self._connection()
                conn.request("GET", f"{GROUP_PATH}/llmdeployments?labelSelector={selector}")
                listing = json.loads(conn.getresponse().read())
                now = time.monotonic()
                for obj in listing.get("items") or []:
                    self._note(obj, now)
                version = listing["metadata"]["resourceVersion"]
                conn.request("GET", f"{GROUP_PATH}/llmdeployments?labelSelector={selector}&watch=true"
                             f"&resourceVersion={version}&allowWatchBookmarks=true&timeoutSeconds=300")
                response = conn.getresponse()
                while not self.stop.is_set():
                    line = response.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._note(event["object"], time.monotonic())
                conn.close()
            except (OSError, ValueError, KeyError, http.client.HTTPException):
                self.stop.wait(1)


# ---- the webhook, directly ----------------------------------------------------------------------------------

@dataclass
class WebhookProbe:
    """AdmissionReview POSTs straight to the operator's webhook (one kept-alive connection, as the API server
    does), timed by the client."""

    port: int
    ca_file: Path
    spec: dict[str, Any]
    rate: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def review(self) -> bytes:
        obj = {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment",
               "metadata": {"name": "probe", "namespace": f"{NAMESPACE_PREFIX}00"}, "spec": self.spec}
        return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "kind": {"group": "llm-autopilot.io", "version": "v1alpha1",
                                               "kind": "LLMDeployment"},
            "resource": {"group": "llm-autopilot.io", "version": "v1alpha1", "resource": "llmdeployments"},
            "operation": "CREATE", "name": "probe", "namespace": f"{NAMESPACE_PREFIX}00",
            "userInfo": {"username": "bench-scale", "groups": ["system:masters"]}, "object": obj, "dryRun": True,
        }}).encode()

    def run(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        conn: http.client.HTTPSConnection | None = None
        while not self.stop.is_set():
            body = self.review()
            started = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=30)
                conn.request("POST", WEBHOOK_PATH, body, {"Content-Type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                if not answer["response"]["allowed"]:
                    raise ValueError(answer["response"])
                self.latencies.append(time.monotonic() - started)
            except (OSError, ValueError, KeyError, http.client.HTTPException):
                self.errors += 1
                conn = None
            self.stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - started)))


def paced(rate: float, items: list[Any], work: Callable[[Any], None], workers: int = 4) -> None:
    """Run work(item) for every item at about `rate` per second, from a few threads."""
    lock, start, position = threading.Lock(), time.monotonic(), [0]

    def worker() -> None:
        while True:
            with lock:
                i = position[0]
                if i >= len(items):
                    return
                position[0] += 1
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            work(items[i])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- the run ------------------------------------------------------------------------------------------------

@dataclass
class Figures:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, what: str, value: str, goal: str = "") -> None:
        self.rows.append((what, value, goal))
        say(f"{what}: {value} (load average {os.getloadavg()[0]:.1f})")

    def table(self) -> str:
        lines = ["| figure | measured | goal |", "|---|---|---|"]
        lines += [f"| {what} | {value} | {goal} |" for what, value, goal in self.rows]
        return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


@dataclass(frozen=True)
class Settings:
    n: int
    namespaces: int
    quiet_seconds: float
    create_rate: float
    apply_rate: float
    replica_every: int
    #: the operator's resync interval (RESYNC), None for its own default
    resync: str | None

    @classmethod
    def from_environment(cls) -> Settings:
        n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else int(setting("N", 1000))
        return cls(n=n, namespaces=int(setting("NAMESPACES", 20)), quiet_seconds=setting("QUIET_SECONDS", 300),
                   create_rate=setting("CREATE_RATE", 20), apply_rate=setting("APPLY_RATE", 20),
                   replica_every=int(setting("REPLICA_EVERY", 10)), resync=os.environ.get("RESYNC"))


@dataclass
class Run:
    """What the phases share: the cluster, the operator, the objects, the watch and the figures so far."""

    settings: Settings
    cluster: Cluster
    api: Api
    work: Path
    webhook_port: int
    metrics_port: int
    op: OperatorProcess
    apiserver_pid: int
    names: list[str]
    specs: list[dict[str, Any]]
    objects: list[tuple[str, dict[str, Any]]]
    #: Deployments, Services and PDBs there were before the run
    baseline: dict[str, int]
    watch: PlannedWatch
    figures: Figures = field(default_factory=Figures)
    #: load averages sampled every 10 s while the run lasts
    loads: list[float] = field(default_factory=list)
    sampler: threading.Event = field(default_factory=threading.Event)

    @property
    def ca_file(self) -> Path:
        return self.work / "certs" / "webhook.crt"

    def writes_now(self) -> tuple[dict[str, float], float]:
        return apiserver_writes(self.api), total(operator_metrics(self.metrics_port),
                                                 "llm_autopilot_kubernetes_writes_total")


def prepare(s: Settings) -> Run:
    """The CRD applied, the Service range checked, the operator configured (not started), the load sampled."""
    env = _cluster_env()
    cluster = Cluster.load()
    api = Api(cluster)
    subprocess.run(["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(CRD)], env=env, check=True,
                   capture_output=True)
    _, cidr = api.request("GET", "/apis/networking.k8s.io/v1/servicecidrs/kubernetes")
    prefix = int(str((cidr or {}).get("spec", {}).get("cidrs", ["0/24"])[0]).split("/")[1])
    if 2 ** (32 - prefix) - 2 < s.n + 10:
        raise SystemExit(f"the cluster's Service range (/{prefix}) holds fewer than {s.n} Services: "
                         "`python3 hack/cluster.py down`, then `python3 hack/cluster.py up` (a fresh cluster gets "
                         "a /16; LLM_AUTOPILOT_SERVICE_CIDR sets it)")
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    webhook_port, metrics_port = _free_port(), _free_port()
    operator_env = {**env, "LLM_AUTOPILOT_WEBHOOK": "true", "LLM_AUTOPILOT_WEBHOOK_PORT": str(webhook_port),
                    "LLM_AUTOPILOT_WEBHOOK_CERT_DIR": str(work / "certs"), "LLM_AUTOPILOT_WEBHOOK_MANAGED": "false",
                    "LLM_AUTOPILOT_METRICS_PORT": str(metrics_port), "HF_ENDPOINT": "http://127.0.0.1:9",
                    "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1"}
    operator_env.pop("LLM_AUTOPILOT_RESYNC_SECONDS", None)
    if s.resync:
        operator_env["LLM_AUTOPILOT_RESYNC_SECONDS"] = s.resync
    op = OperatorProcess(operator_env, work / "operator.log", verbose=bool(os.environ.get("VERBOSE")))
    specs = templates()
    run = Run(settings=s, cluster=cluster, api=api, work=work, webhook_port=webhook_port, metrics_port=metrics_port,
              op=op, apiserver_pid=int(cluster.pid_file("kube-apiserver").read_text()),
              names=[f"{NAMESPACE_PREFIX}{i:02d}" for i in range(s.namespaces)], specs=specs,
              objects=[manifest(i, s.namespaces, s.replica_every, specs) for i in range(s.n)],
              baseline={}, watch=PlannedWatch(cluster))

    def sample_load() -> None:  # the machine is shared: the figures come with how busy it was
        while not run.sampler.wait(10):
            run.loads.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, daemon=True).start()
    say(f"N={s.n} in {s.namespaces} namespaces, resync {s.resync or 'default'} s; work dir {work}")
    run.baseline = {kind: count(api, path) for kind, path in CHILD_PATHS.items()}
    return run


def start_operator(run: Run) -> None:
    """The namespaces, the operator, its webhook registered and called by the API server, the Planned watch."""
    api, op = run.api, run.op
    # a previous run's namespaces are deleted in the background (Terminating): creating them again would fail
    wait_until("a previous run's namespaces gone", lambda: all(
        api.request("GET", f"/api/v1/namespaces/{ns}")[0] == 404 for ns in run.names), 600, interval=2)
    for ns in run.names:
        code, body = api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": ns, "labels": {BENCH_LABEL: "scale"}}})
        if code != 201:
            raise RuntimeError(f"namespace {ns}: {code} {body}")
    op.start()
    wait_until("the webhook to listen", lambda: op.alive() and listening(run.webhook_port), 120)
    ca = run.ca_file.read_bytes()
    code, body = api.request("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                             webhook_configuration(run.webhook_port, ca))
    if code not in (200, 201):
        raise RuntimeError(f"webhook configuration: {code} {body}")
    # the API server calls the webhook once its configuration informer has it: a dry-run create that the
    # webhook refuses (an unknown GPU) proves it
    bad = {**run.objects[0][1], "spec": {**run.objects[0][1]["spec"], "gpu": {"product": "nvidia-a1000"}}}
    wait_until("the API server calling the webhook", lambda: "nvidia-a1000" in str(api.request(
        "POST", f"{GROUP_PATH}/namespaces/{run.names[0]}/llmdeployments?dryRun=All", bad)[1]), 60)
    threading.Thread(target=run.watch.run, daemon=True).start()


def create_phase(run: Run) -> None:
    """N creates at CREATE_RATE through the webhook: until all are Planned, the webhook probed meanwhile."""
    api, op, watch, figures, n = run.api, run.op, run.watch, run.figures, run.settings.n
    created: dict[str, float] = {}
    failures: list[str] = []
    probe = WebhookProbe(run.webhook_port, run.ca_file, run.specs[0], rate=5)
    threading.Thread(target=probe.run, daemon=True).start()
    histogram = webhook_histogram(api)
    cpu0, api_cpu0, first = cpu_seconds(op.pid), cpu_seconds(run.apiserver_pid), time.monotonic()

    def create(item: tuple[str, dict[str, Any]]) -> None:
        ns, obj = item
        code, body = api.request("POST", f"{GROUP_PATH}/namespaces/{ns}/llmdeployments", obj, timeout=60)
        if code == 201:
            created[f"{ns}/{obj['metadata']['name']}"] = time.monotonic()
        else:
            failures.append(f"{obj['metadata']['name']}: {code} {str(body)[:200]}")

    paced(run.settings.create_rate, run.objects, create)
    created_in = time.monotonic() - first
    say(f"created {len(created)} of {n} in {created_in:.0f} s ({len(failures)} refused"
        f"{': ' + failures[0] if failures else ''})")
    bound = max(600.0, 2 * n)
    try:
        wait_until(f"all {len(created)} Planned", lambda: op.alive() and len(
            [k for k in created if k in watch.planned]) >= len(created), bound, interval=1)
    except RuntimeError:
        say(f"only {len(watch.planned)} Planned after {bound:.0f} s; not Planned: "
            f"{list(watch.refused.items())[:3]}")
    probe.stop.set()
    all_planned = max((watch.planned[k] for k in created if k in watch.planned), default=float("nan")) - first
    latency = [watch.planned[k] - t for k, t in created.items() if k in watch.planned]
    creation_cpu = cpu_seconds(op.pid) - cpu0
    figures.add("apply -> all Planned", f"{all_planned:.0f} s ({len(latency)} of {n} Planned; created at "
                f"{len(created) / created_in:.1f}/s)")
    figures.add("creation -> Planned, p50 / p99", f"{percentile(latency, 0.5):.1f} s / "
                f"{percentile(latency, 0.99):.1f} s", "every object within 120 s")
    figures.add("webhook during creation, p50 / p99 (direct; API server's histogram)",
                f"{ms(percentile(probe.latencies, 0.5))} / {ms(percentile(probe.latencies, 0.99))}; "
                f"{ms(histogram_quantile(histogram, webhook_histogram(api), 0.5))} / "
                f"{ms(histogram_quantile(histogram, webhook_histogram(api), 0.99))}")
    figures.add("operator CPU while creating", f"{creation_cpu:.0f} s (API server "
                f"{cpu_seconds(run.apiserver_pid) - api_cpu0:.0f} s)")
    if watch.refused:
        figures.add("not Planned", f"{len(watch.refused)}, e.g. {next(iter(watch.refused.items()))}")


def quiet_phase(run: Run) -> str:
    """Once no writes come for a resync interval: CPU, writes and memory over QUIET_SECONDS at rest.

    Returns the operator's /metrics at the end, which the restart phase reads."""
    api, op, figures, metrics_port = run.api, run.op, run.figures, run.metrics_port
    quiet_seconds, resync = run.settings.quiet_seconds, run.settings.resync

    def settled() -> bool:
        before = run.writes_now()
        time.sleep(float(resync or 60) + 10)
        return op.alive() and run.writes_now() == before

    wait_until("no writes for a resync interval", settled, 900, interval=0)
    writes0, opwrites0 = apiserver_writes(api), total(operator_metrics(metrics_port),
                                                       "llm_autopilot_kubernetes_writes_total")
    metrics0 = operator_metrics(metrics_port)
    cpu0, api_cpu0 = cpu_seconds(op.pid), cpu_seconds(run.apiserver_pid)
    say(f"quiet period: {quiet_seconds:.0f} s")
    time.sleep(quiet_seconds)
    op.alive()
    cpu, api_cpu = cpu_seconds(op.pid) - cpu0, cpu_seconds(run.apiserver_pid) - api_cpu0
    writes = {r: v - writes0[r] for r, v in apiserver_writes(api).items()}
    metrics1 = operator_metrics(metrics_port)
    opwrites = total(metrics1, "llm_autopilot_kubernetes_writes_total") - opwrites0
    rss = memory_mib(op.pid, "VmRSS")
    figures.add("operator RSS at rest / peak", f"{rss:.0f} / {memory_mib(op.pid, 'VmHWM'):.0f} MiB", "< 300 MiB")
    figures.add(f"operator CPU in a {quiet_seconds:.0f}-s quiet period",
                f"{cpu:.1f} s ({100 * cpu / quiet_seconds:.1f} % of a core)", "< 5 % of a core")
    figures.add("API server CPU in the quiet period",
                f"{api_cpu:.1f} s ({100 * api_cpu / quiet_seconds:.1f} % of a core)", "barely notices")
    figures.add("API writes in the quiet period", f"{sum(writes.values()):.0f} ("
                + ", ".join(f"{r} {v:.0f}" for r, v in writes.items()) + f"; operator's counter {opwrites:.0f})",
                "0")
    for name, label in (("llm_autopilot_resyncs_total", "resyncs"),
                        ("llm_autopilot_prometheus_queries_total", "Prometheus queries")):
        if name in metrics1:
            change = {labels.get("result", ""): value - total(metrics0, name, **labels)
                      for labels, value in samples(metrics1, name)}
            figures.add(f"{label} in the quiet period", ", ".join(f"{k or 'all'} {v:.0f}"
                                                                  for k, v in sorted(change.items())))
    return metrics1


def webhook_phase(run: Run) -> None:
    """The webhook's latency while APPLY_RATE dry-run creates a second arrive for 30 s and the N resync."""
    api, figures, s = run.api, run.figures, run.settings
    probe = WebhookProbe(run.webhook_port, run.ca_file, run.specs[0], rate=5)
    threading.Thread(target=probe.run, daemon=True).start()
    histogram = webhook_histogram(api)
    round_trips: list[float] = []

    def dry_run(i: int) -> None:
        ns, obj = manifest(s.n + i, s.namespaces, s.replica_every, run.specs)
        started = time.monotonic()
        code, _ = api.request("POST", f"{GROUP_PATH}/namespaces/{ns}/llmdeployments?dryRun=All", obj, timeout=60)
        if code == 201:
            round_trips.append(time.monotonic() - started)

    paced(s.apply_rate, list(range(int(30 * s.apply_rate))), dry_run)
    probe.stop.set()
    after = webhook_histogram(api)
    figures.add(f"webhook at {s.apply_rate:.0f} applies/s with {s.n} resyncing, p50 / p99 (direct)",
                f"{ms(percentile(probe.latencies, 0.5))} / {ms(percentile(probe.latencies, 0.99))} "
                f"({len(probe.latencies)} reviews, {probe.errors} errors)", "p99 < 100 ms")
    figures.add("  the same, API server's webhook histogram p50 / p99",
                f"{ms(histogram_quantile(histogram, after, 0.5))} / "
                f"{ms(histogram_quantile(histogram, after, 0.99))}")
    figures.add("  dry-run create round trip p50 / p99", f"{ms(percentile(round_trips, 0.5))} / "
                f"{ms(percentile(round_trips, 0.99))} ({len(round_trips)} applies)")


def restart_phase(run: Run, metrics_before: str) -> None:
    """The operator stopped and started with N objects present: until every one is checked, and the writes.

    ``metrics_before`` (the quiet phase's /metrics) says whether this operator counts checked objects."""
    api, op, figures, n, metrics_port = run.api, run.op, run.figures, run.settings.n, run.metrics_port
    writes0 = apiserver_writes(api)
    op.stop()
    restarted = time.monotonic()
    op.start()

    def checked() -> bool:
        text = operator_metrics(metrics_port)
        return op.alive() and total(text, "llm_autopilot_llmdeployments_checked") >= n

    if "llm_autopilot_llmdeployments_checked" in metrics_before:
        wait_until("every object checked after the restart", checked, 600, interval=0.5)
        all_checked = time.monotonic() - restarted
        time.sleep(5)
        writes = {r: v - writes0[r] for r, v in apiserver_writes(api).items()}
        opwrites = total(operator_metrics(metrics_port), "llm_autopilot_kubernetes_writes_total")
        figures.add(f"restart with {n} objects: every object checked", f"{all_checked:.0f} s, "
                    f"{sum(writes.values()):.0f} writes (" + ", ".join(f"{r} {v:.0f}" for r, v in writes.items())
                    + f"; operator's counter {opwrites:.0f})", "60 s, 0 writes")
    else:
        figures.add("restart", "not measured: this operator has no llm_autopilot_llmdeployments_checked")


def delete_phase(run: Run) -> None:
    """Every LLMDeployment deleted, namespace by namespace: until they and their children are gone."""
    api, op, figures, n = run.api, run.op, run.figures, run.settings.n
    wait_until("the operator up", lambda: op.alive() and listening(run.metrics_port), 120)
    started = time.monotonic()
    for ns in run.names:
        api.request("DELETE", f"{GROUP_PATH}/namespaces/{ns}/llmdeployments", timeout=300)
    deleted = time.monotonic() - started
    wait_until("every LLMDeployment gone", lambda: count(api, f"{GROUP_PATH}/llmdeployments") == 0, 600)
    objects_gone = time.monotonic() - started
    wait_until("every child gone", lambda: all(count(api, path) <= run.baseline[kind]
                                               for kind, path in CHILD_PATHS.items()), 900, interval=1)
    children_gone = time.monotonic() - started
    time.sleep(10)
    figures.add(f"delete {n}: LLMDeployments / Deployments, Services, PDBs gone",
                f"{objects_gone:.0f} s / {children_gone:.0f} s (the delete calls took {deleted:.0f} s)", "60 s")
    figures.add("operator RSS after the deletes", f"{memory_mib(op.pid, 'VmRSS'):.0f} MiB")


def clean_up(run: Run) -> None:
    """Whatever the phases got to: the threads, the operator, the webhook configuration, the namespaces."""
    run.watch.stop.set()
    run.sampler.set()
    run.op.stop()
    run.api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_NAME}")
    for ns in run.names:
        with contextlib.suppress(OSError):
            run.api.request("DELETE", f"/api/v1/namespaces/{ns}")


def report(run: Run) -> None:
    s, loads = run.settings, run.loads
    print(f"\nbench-scale: N={s.n} LLMDeployments in {s.namespaces} namespaces, one operator replica, resync "
          f"{s.resync or 'default (60)'} s, webhook on; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load "
          f"average over the run {statistics.mean(loads) if loads else float('nan'):.1f} "
          f"(max {max(loads, default=0):.1f})")
    print(run.figures.table())
    say(f"operator log: {run.op.log}")


def main() -> None:
    run = prepare(Settings.from_environment())
    try:
        start_operator(run)
        create_phase(run)
        metrics = quiet_phase(run)
        webhook_phase(run)
        restart_phase(run, metrics)
        delete_phase(run)
    finally:
        clean_up(run)
    report(run)


if __name__ == "__main__":
    main()
