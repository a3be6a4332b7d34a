"""End-to-end fixtures: the real local control plane (hack/cluster.py), the CRD, the operator as a process.

The cluster is started by `hack/cluster.py up` (idempotent; the first run builds the binaries). Isolation
(tests/README.md): the session-wide operator (`operator`) watches only the namespaces of the tests that use
it (`e2e-op-*`, labelled for its admission webhook), every test that runs its own operator gives it its own
namespace with `--namespace`, each test gets a fresh namespace that is emptied of pods before the next test
starts, and the session ends by checking that nothing it created is left in the cluster.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hack.dev import cluster_env, operator_running, state_dir
from hack.localcluster.kubelet import NODE_PREFIX as VLLM_CPU_NODE_PREFIX

from tests.e2e import lanes

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = [sys.executable, str(ROOT / "hack" / "cluster.py")]
CRD = ROOT / "crds" / "llm-autopilot.io_llmdeployments.yaml"
INFEASIBLE = ROOT / "examples" / "infeasible-llama-405b.yaml"
RESYNC_SECONDS = 3

#: namespaces of tests that use the session operator: the only ones it watches (a Kopf glob); one per xdist
#: worker ("e2e-opgw0-"), so the two lanes' session operators never see each other's namespaces
SESSION_PREFIX = f"e2e-op{lanes.WORKER}-"
#: namespaces of every other test (their own operators, or none); 8 hex digits never match SESSION_PREFIX
OWN_PREFIX = "e2e-"
#: on every test namespace: which pytest run made it (a run that died is swept by the next one)
RUN_LABEL = "e2e.llm-autopilot.io/run"
RUN_PID = "e2e.llm-autopilot.io/pid"
#: on the session operator's namespaces: its ValidatingWebhookConfiguration selects them by this label
SESSION_LABEL = "e2e.llm-autopilot.io/operator"
SESSION_LABEL_VALUE = f"session{lanes.WORKER}"
SESSION_WEBHOOK = f"e2e-session{lanes.WORKER}.llm-autopilot.io"
RUN_ID = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
#: how long a deleted namespace may keep pods (so GPUs) before the next test starts
NAMESPACE_DRAIN_SECONDS = 180.0  # a pod's grace period is 10 + drainSeconds + 15 (145 s by default)
#: how long the session end waits for every namespace it deleted to be gone
SESSION_CLEANUP_SECONDS = 180.0


def _cluster_env() -> dict[str, str]:
    with lanes.run_lock():  # one `up` at a time: the other lane's worker finds it up
        subprocess.run([*CLUSTER, "up"], check=True, stdout=sys.stderr)
    return cluster_env()


@dataclass
class Kubectl:
    env: dict[str, str]

    def __call__(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, input=input,
                                timeout=60, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self("get", *args, "-o", "json").stdout)

    def maybe(self, *args: str) -> Any:
        result = self("get", *args, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class OperatorDied(RuntimeError):
    """The operator process exited while a test waited on it (not retried by wait_for)."""


class Operator:
    """`llm-autopilot operator ARGS` as a child process (own log), restartable, stopped with SIGTERM or SIGKILL.

    Every instance started in the session is remembered: one still running when the session ends is stopped
    and reported as left behind.
    """

    started: ClassVar[list[Operator]] = []

    def __init__(self, env: dict[str, str], log: Path, args: list[str] | None = None,
                 ready: Callable[[Operator], bool] | None = None, shared: bool = False) -> None:
        self.env, self.log, self.args, self.ready = env, log, list(args or []), ready
        #: the session operator (the `operator` fixture): only tests that request it may see it
        self.shared = shared
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        """Start the process; with `ready`, return only once ready(self) holds (e.g. the webhook listens)."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llm_autopilot.cli.main", "operator", "--verbose", *self.args],
                env=self.env, stdout=out, stderr=subprocess.STDOUT)
        if self not in Operator.started:
            Operator.started.append(self)
        if self.ready is not None:
            ready = self.ready
            wait_for(f"the operator ready ({self.log})", lambda: self.alive() and ready(self), timeout=90)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def alive(self) -> bool:
        """True while running; raises OperatorDied (with the log's tail) once it has exited."""
        if not self.running():
            raise OperatorDied(f"the operator exited; log {self.log}:\n{self.output()[-3000:]}")
        return True

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self, since: int = 0) -> str:
        """The log, from byte offset `since` (a mark())."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def touched(self, namespace: str, since: int = 0) -> list[str]:
        """Log lines after `since` that name `namespace` (with --verbose: every object Kopf handles there, every
        request the operator's client makes there). Kopf's namespace observer is not work in a namespace: it
        watches the namespace list to match the operator's patterns, and logs any namespace's termination."""
        return [line for line in self.output(since).splitlines()
                if namespace in line and " kopf._core.reactor.observation " not in line]

    def mark(self) -> int:
        """The log's current end: count what happens from here on (output(since=...), reconciles(...))."""
        return self.log.stat().st_size if self.log.exists() else 0

    def reconciles(self, namespace: str, name: str, since: int = 0) -> int:
        """Reconciles of namespace/name in the log after `since`.

        With --verbose the operator logs one line per reconcile that names the object ("reconciled NS/NAME
        (resync, quiet)"), full or quiet, so the count is exact per object (Kopf's own log lines do not name it).
        """
        pattern = re.compile(rf" reconciled {re.escape(namespace)}/{re.escape(name)} \(")
        return len(pattern.findall(self.output(since)))

    def wait_reconciles(self, namespace: str, name: str, count: int, since: int, timeout: float | None = None) -> None:
        """Wait until `count` reconciles of namespace/name have completed after `since`.

        A reconcile's line comes before Kopf applies its status patch, so `count` + 1 lines prove `count`
        complete ones (the resync timer never overlaps itself). The bound scales with the resync interval, with
        room for a loaded machine.
        """
        bound = timeout if timeout is not None else 60 + 4 * RESYNC_SECONDS * count
        wait_for(f"{count} complete reconciles of {namespace}/{name} ({self.log})",
                 lambda: self.alive() and self.reconciles(namespace, name, since) > count, timeout=bound)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_dev_operator(kubectl: Kubectl) -> None:
    """`make dev`'s operator watches every namespace and validates every LLMDeployment: it would reconcile
    the tests' objects too. Stop it the way `make down` does (`make dev` starts it again)."""
    pid_file = state_dir(kubectl.env) / "operator.pid"
    if not operator_running(pid_file):
        return
    pid = int(pid_file.read_text())
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and b"llm-autopilot" not in cmdline.read_bytes():
        return  # a stale pid file whose pid was reused
    sys.stderr.write(f"stopping `make dev`'s operator (pid {pid}): it would reconcile the tests' objects; "
                     "`make dev` starts it again\n")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    wait_for("`make dev`'s operator to exit", lambda: not _pid_alive(pid), timeout=30)
    pid_file.unlink(missing_ok=True)
    kubectl("delete", "validatingwebhookconfiguration,mutatingwebhookconfiguration", "llm-autopilot.io",
            "--ignore-not-found", check=False)


# ---- nothing left behind ---------------------------------------------------------------------------------
#: the cluster-scoped objects tests create (webhook configurations, the chart's RBAC, cluster peerings); the
#: CRDs the fixtures install are the environment, like the cluster itself, and stay
CLUSTER_KINDS = "validatingwebhookconfigurations,mutatingwebhookconfigurations,clusterroles,clusterrolebindings"
PROMETHEUS_DIRS = ("LLM_AUTOPILOT_PROMETHEUS_RULES_DIR", "LLM_AUTOPILOT_EXTRA_TARGETS_DIR",
                   "LLM_AUTOPILOT_VLLM_TARGETS_DIR")


def _names(kubectl: Kubectl, kinds: str, optional: bool = False) -> set[str]:
    result = kubectl("get", kinds, "-o", "name", check=not optional)
    return set(result.stdout.split()) if result.returncode == 0 else set()


def _cluster_objects(kubectl: Kubectl) -> set[str]:
    # the peering CRD exists only once the chart tests installed it
    return (_names(kubectl, f"{CLUSTER_KINDS},namespaces")
            | _names(kubectl, "clusterkopfpeerings.kopf.dev", optional=True))


def _files(env: dict[str, str]) -> set[str]:
    found: set[str] = set()
    for key in PROMETHEUS_DIRS:
        directory = Path(env[key]) if env.get(key) else None
        if directory and directory.is_dir():
            found |= {str(p) for p in directory.iterdir()}
    return found


def _strip_finalizers(kubectl: Kubectl, namespace: str) -> None:
    """Remove the operator's finalizer from the LLMDeployments of a namespace being deleted.

    Kopf puts it there for the resync timer; a test's operator that has stopped never removes it (the
    namespace would stay Terminating), and a running one may wait up to Kopf's cancellation polling (60 s)
    when a resync is in flight. The deletion path itself is tested in test_operator.py.
    """
    items = (kubectl.maybe("llmd", "-n", namespace) or {}).get("items") or []
    for obj in items:
        if obj["metadata"].get("finalizers"):
            kubectl("patch", "llmd", obj["metadata"]["name"], "-n", namespace, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False)


def _delete_namespace(kubectl: Kubectl, namespace: str) -> None:
    # deleting the LLMDeployments first gives them a deletionTimestamp, so no operator re-adds the finalizer
    kubectl("delete", "llmd", "--all", "-n", namespace, "--wait=false", check=False)
    _strip_finalizers(kubectl, namespace)
    kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _sweep_dead_runs(kubectl: Kubectl) -> None:
    """Delete test namespaces left by pytest runs that died (SIGKILL, a CI timeout)."""
    namespaces = kubectl.json("namespaces", "-l", RUN_LABEL).get("items") or []
    for ns in namespaces:
        pid = (ns["metadata"].get("annotations") or {}).get(RUN_PID, "")
        if not (pid.isdigit() and _pid_alive(int(pid))):
            _delete_namespace(kubectl, ns["metadata"]["name"])


def _terminating(kubectl: Kubectl, before: set[str]) -> list[str]:
    """Namespaces made in this session that are still being deleted (their LLMDeployments' operators are
    gone by now: strip the finalizers that would keep them)."""
    items = (kubectl.maybe("namespaces") or {}).get("items") or []
    names = [ns["metadata"]["name"] for ns in items
             if ns["metadata"].get("deletionTimestamp") and f"namespace/{ns['metadata']['name']}" not in before]
    for name in names:
        _strip_finalizers(kubectl, name)
    return names


def _leftovers(kubectl: Kubectl, objects: set[str], files: set[str]) -> list[str]:
    """What this session created and did not remove (after a bounded wait for deleted namespaces to go)."""
    with contextlib.suppress(AssertionError):  # what is left is reported below
        wait_for("the session's namespaces to be deleted", lambda: not _terminating(kubectl, objects),
                 timeout=SESSION_CLEANUP_SECONDS, interval=2)
    left = sorted(_cluster_objects(kubectl) - objects)
    left += sorted(f"file {f}" for f in _files(kubectl.env) - files)
    return left


@pytest.fixture(scope="session")
def kubectl() -> Iterator[Kubectl]:
    k = Kubectl(_cluster_env())
    _stop_dev_operator(k)
    k("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    k("wait", "--for=condition=Established", "crd/llmdeployments.llm-autopilot.io", "--timeout=60s")
    _sweep_dead_runs(k)
    lanes.session_started(_cluster_objects(k), _files(k.env))
    yield k
    running = [op for op in Operator.started if op.running()]
    left = [f"operator process {op.process.pid} ({op.log})" for op in running if op.process]
    for op in running:
        op.stop(signal.SIGKILL)
    before = lanes.session_ended()
    if before is not None:  # the last lane to end: what the whole run left in the cluster
        left += _leftovers(k, *before)
    if left:
        pytest.fail("the end-to-end session left state behind:\n  " + "\n  ".join(left), pytrace=False)


def session_webhook(port: int, ca: bytes) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration Kopf would manage for the operator, limited to the namespaces of
    tests that use the session operator (Kopf's own has no namespaceSelector: it would validate every test's
    LLMDeployments, also those meant for a test's own operator and webhook)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": SESSION_WEBHOOK},
        "webhooks": [{
            "name": "validate-llmdeployment.llm-autopilot.io", "sideEffects": "None", "failurePolicy": "Fail",
            "matchPolicy": "Equivalent", "timeoutSeconds": 30, "admissionReviewVersions": ["v1", "v1beta1"],
            "namespaceSelector": {"matchLabels": {SESSION_LABEL: SESSION_LABEL_VALUE}},
            "rules": [{"apiGroups": ["llm-autopilot.io"], "apiVersions": ["v1alpha1"],
                       "resources": ["llmdeployments"], "operations": ["CREATE", "UPDATE"], "scope": "*"}],
            "clientConfig": {"url": f"https://127.0.0.1:{port}/validate-llmdeployment",
                             "caBundle": base64.b64encode(ca).decode()},
        }],
    }


def _create_namespace(kubectl: Kubectl, name: str, session_operator: bool) -> None:
    labels = {RUN_LABEL: RUN_ID, **({SESSION_LABEL: SESSION_LABEL_VALUE} if session_operator else {})}
    manifest = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels, "annotations": {RUN_PID: str(os.getpid())}}}
    kubectl("create", "-f", "-", input=json.dumps(manifest))


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator shared by the tests that request it, watching only their namespaces (`e2e-op-*`)."""
    workdir = tmp_path_factory.mktemp("operator")
    port = _free_port()
    env = {**kubectl.env, "LLM_AUTOPILOT_RESYNC_SECONDS": str(RESYNC_SECONDS), "LLM_AUTOPILOT_WEBHOOK": "true",
           "LLM_AUTOPILOT_WEBHOOK_PORT": str(port), "LLM_AUTOPILOT_WEBHOOK_CERT_DIR": str(workdir / "certs"),
           "LLM_AUTOPILOT_WEBHOOK_MANAGED": "false",
           "HF_ENDPOINT": "http://127.0.0.1:9", "LLM_AUTOPILOT_HUB_TIMEOUT_SECONDS": "1",
           "LLM_AUTOPILOT_METRICS_PORT": str(_free_port()),
           # the operator's key, as the chart gives it (its key Secret): a restart keeps it, so the status it
           # attested before is its own after (restart tests write nothing)
           "LLM_AUTOPILOT_CALIBRATION_KEY": uuid.uuid4().hex * 2}
    # ready (also after a test restarts it) once the admission server listens
    op = Operator(env, workdir / "operator.log", [f"--namespace={SESSION_PREFIX}*"],
                  ready=lambda _: listening(port), shared=True)
    try:
        op.start()
        kubectl("apply", "-f", "-", input=json.dumps(session_webhook(port, (workdir / "certs" / "webhook.crt")
                                                                      .read_bytes())))
        probe = f"{SESSION_PREFIX}probe-{uuid.uuid4().hex[:6]}"
        _create_namespace(kubectl, probe, session_operator=True)
        try:
            def denied() -> bool:
                result = kubectl("apply", "--dry-run=server", "-n", probe, "-f", str(INFEASIBLE), check=False)
                return result.returncode != 0 and "denied the request" in result.stderr
            # the API server calls the webhook once its configuration informer has it
            wait_for("the API server calling the session operator's webhook", denied, timeout=60)
        finally:
            _delete_namespace(kubectl, probe)
        yield op
    finally:
        op.stop()
        kubectl("delete", "validatingwebhookconfiguration", SESSION_WEBHOOK, "--ignore-not-found", check=False)
        sys.stderr.write(f"operator log: {op.log}\n")


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; watched by the session operator exactly when the test uses `operator`.

    Teardown deletes it and waits until its pods are gone, so the next test finds the simulated GPUs free.
    """
    session_operator = "operator" in request.fixturenames
    name = f"{SESSION_PREFIX if session_operator else OWN_PREFIX}{uuid.uuid4().hex[:8]}"
    shared = [(op, op.mark()) for op in Operator.started if op.shared]
    _create_namespace(kubectl, name, session_operator)
    yield name
    if lanes.WORKER and lanes.lane_of(request.node) != lanes.VLLM_CPU_LANE:
        nodes = kubectl("get", "pods", "-n", name, "-o", "jsonpath={.items[*].spec.nodeName}", check=False).stdout
        on_cpu = sorted({n for n in nodes.split() if n.startswith(VLLM_CPU_NODE_PREFIX)})
        assert not on_cpu, (f"a pod of {request.node.nodeid} ran on {', '.join(on_cpu)}, beside the vllm-cpu lane: "
                            "a test on the vllm-cpu nodes uses the `real_vllm` fixture (tests/e2e/lanes.py)")
    _delete_namespace(kubectl, name)
    wait_for(f"the pods of namespace {name} to be deleted",
             lambda: not kubectl("get", "pods", "-n", name, "-o", "name", check=False).stdout.strip(),
             timeout=NAMESPACE_DRAIN_SECONDS)
    if not session_operator:  # the test ran its own operator, or none: the session operator kept out
        for op, mark in shared:
            seen = op.touched(name, since=mark)
            assert not seen, (f"the session operator worked in {name}, a namespace of a test that does not use "
                              f"it ({len(seen)} requests, e.g. {seen[0][:300]})")


# ---- the Helm chart: helm at its pinned version, and the cluster with every CRD the chart's manifests use ----
CHART = ROOT / "charts" / "llm-autopilot"
HELM_PY = ROOT / "hack" / "helm.py"
#: the release namespace and watched namespaces of the offline renders (created for the dry-runs)
DRY_NS, DRY_WATCHED = "chart-dry", ("chart-dry-a", "chart-dry-b")


@pytest.fixture(scope="session")
def helm() -> Path:
    out = subprocess.run([sys.executable, str(HELM_PY), "path"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def chart_cluster(kubectl: Kubectl) -> Iterator[Kubectl]:
    """The cluster with every CRD the chart's manifests use, and the dry-run namespaces (deleted afterwards;
    the CRDs stay, like the cluster)."""
    out = subprocess.run([sys.executable, str(HELM_PY), "crds", "--print"], check=True, capture_output=True,
                         text=True)
    files = [*sorted((CHART / "crds").glob("*.yaml")), *(Path(p) for p in out.stdout.split())]
    for path in files:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for crd in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "servicemonitors.monitoring.coreos.com",
                "podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com",
                "certificates.cert-manager.io", "issuers.cert-manager.io"):
        kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    created = [ns for ns in (DRY_NS, *DRY_WATCHED) if kubectl.maybe("namespace", ns) is None]
    for ns in created:
        kubectl("create", "namespace", ns)
    yield kubectl
    for ns in created:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


# The metrics fixtures (Prometheus, the vLLM simulator) for every end-to-end module; imported last because
# tests/e2e/metrics.py itself imports from this module.
from tests.e2e.metrics import prometheus_url, vllm_sim  # noqa: E402, F401
