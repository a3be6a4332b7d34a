"""One pod on a process-kubelet node: its containers' lifecycle and probes, and the status the kubelet reports.

Follows the kubelet's rules where the operator can see them:
- probes: the startup probe first (every ``periodSeconds``; ``failureThreshold`` misses kill the container),
  then readiness (Ready) and liveness (``failureThreshold`` misses kill the container); HTTP GET to the pod
  IP, success on 200-399 within ``timeoutSeconds``;
- restarts (``restartPolicy: Always``, and ``OnFailure`` after a non-zero exit): the first restart at once, then
  the kubelet's crash-loop back-off, 10 s doubling to 300 s, forgotten after 10 minutes without a crash
  (``initialCrashLoopBackOff``, ``MaxContainerBackOff``, flowcontrol's 2 x max expiry), shown as
  ``waiting: CrashLoopBackOff``; with ``Never`` (or ``OnFailure`` after exit 0) the container stays
  ``terminated`` and once every container has, the pod's phase is ``Succeeded`` (all exited 0) or ``Failed``:
  what the Job controller counts;
- volumes: ``emptyDir`` (a fresh per-pod folder, or a tmpfs for ``medium: Memory``) and
  ``persistentVolumeClaim`` (the bound PersistentVolume's hostPath/local folder), bind-mounted in the
  container's own mount namespace, read-only when the volumeMount or the claim's volume source says
  ``readOnly`` (a write gets EROFS); ``subPath`` too. Nothing else of the host is given: a container's HOME,
  unless its spec sets one, is a fresh empty folder per container instance (its image's writable layer);
- ``lastState.terminated`` with exitCode, reason (``OOMKilled`` from the memory cgroup), times, and the
  message: what the container wrote to its ``terminationMessagePath`` (a per-instance file of the pod's folder
  bind-mounted there, default ``/dev/termination-log``; its last 4096 bytes, as the kubelet reads it), else
  with ``FallbackToLogsOnError`` the last 80 lines / 2048 bytes of the log, for a non-zero exit;
- the log of the current and the previous instance stay readable (``pods/log``, ``previous=true``);
- a deleted pod's containers stop as the kubelet stops them, all at once: the exec ``preStop`` hook in the
  container (its namespaces, cgroup and environment; a failure is a ``FailedPreStopHook`` Event), then SIGTERM to
  the container's main process only, then SIGKILL once the deletion's grace period (``deletionGracePeriodSeconds``,
  else ``terminationGracePeriodSeconds``; at most 600 s), counted from the deletion's start, is over;
- ``readinessGates``: Ready only when the containers are ready and every gate's condition (written by others,
  kept: the status is a strategic merge, conditions by type) is True, else ``ReadinessGatesNotReady``.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import runtime
from .crilog import message_file, rfc3339_nano, termination_message
from .memcg import MemoryCgroup
from .podnet import PodNetwork

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
INITIAL_BACKOFF = 10.0
MAX_BACKOFF = 300.0
TICK = 0.5
#: a container a probe failed gets at most this long after SIGTERM: the tests' patience
MAX_GRACE_SECONDS = 15.0
#: a deleted pod's grace period at most (its preStop hooks and its containers' drain): longer than any drain a
#: test asks for, short enough that a stuck container does not hold a test for its whole hour
MAX_DELETION_GRACE_SECONDS = 600.0
#: the kubelet's minimumGracePeriodInSeconds: what a container gets after a preStop hook that used up the rest
MIN_GRACE_AFTER_HOOK_SECONDS = 2.0
VOLUME_RETRY_SECONDS = 2.0

_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(text: str | int | None) -> int | None:
    if text is None:
        return None
    value = str(text)
    for suffix, factor in _QUANTITY.items():
        if value.endswith(suffix):
            return int(float(value[: -len(suffix)]) * factor)
    return int(float(value))


def crash_backoff(current: float, updated_at: float, now: float) -> tuple[float, float]:
    """(wait before this restart, the back-off to keep) after a crash at ``now``: flowcontrol's Backoff as the
    kubelet uses it: no entry yet (or one untouched for 2 x max) restarts at once and records the initial
    value; a live entry makes the restart wait that long, and doubles (capped)."""
    if not current or now - updated_at > 2 * MAX_BACKOFF:
        return 0.0, INITIAL_BACKOFF
    return current, min(MAX_BACKOFF, current * 2)


@dataclasses.dataclass
class Probe:
    """One probe's schedule and counters."""

    spec: dict[str, Any]
    next_at: float = 0.0
    failures: int = 0
    successes: int = 0

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def failure_threshold(self) -> int:
        return int(self.spec.get("failureThreshold", 3))

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> None:
        self.next_at = now + self.period
        self.failures, self.successes = (0, self.successes + 1) if ok else (self.failures + 1, 0)


@dataclasses.dataclass
class Container:
    spec: dict[str, Any]
    restart_count: int = 0
    instance: runtime.Instance | None = None
    oom_kills_before: int = 0
    last_exit: runtime.Exit | None = None
    last_message: str = ""
    # the exit before last_exit: a container that ends for good after a restart shows it in lastState, as the
    # kubelet does (state.terminated is the final exit; a Job retried in place keeps saying why it was)
    earlier_exit: tuple[runtime.Exit, str] | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    backoff: float = 0.0  # current back-off, 0 = none yet
    backoff_updated: float = 0.0
    restart_at: float = 0.0
    startup: Probe | None = None
    readiness: Probe | None = None
    liveness: Probe | None = None
    started: bool = False  # the startup probe passed (or there is none)
    ready: bool = False
    terminated: bool = False  # exited and not restarted (restartPolicy Never / OnFailure after exit 0)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def port(self, name_or_number: Any) -> int:
        if isinstance(name_or_number, int) or str(name_or_number).isdigit():
            return int(name_or_number)
        for port in self.spec.get("ports") or []:
            if port.get("name") == name_or_number:
                return int(port["containerPort"])
        raise ValueError(f"no container port named {name_or_number!r}")


@dataclasses.dataclass(frozen=True)
class Image:
    """A container "image": the $PATH its command is resolved on (a virtual environment first)."""

    path: str
    problem: str | None  # why it cannot run here (e.g. vLLM not installed), else None


@dataclasses.dataclass(frozen=True)
class StandIns:
    """What the kubelet gives a container for what a CPU has no notion of (documented in kubelet.py)."""

    args: tuple[str, ...] = ()
    #: a simulated device's memory: the memory nodes' meminfo the container sees says this size, all free
    #: (None: the host's own)
    device_memory_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class Environment:
    """What the kubelet gives every container on its nodes."""

    #: by the command's first word, else by the container image's repository (its name without the tag); "" for
    #: every other container (the CPU vLLM)
    images: dict[str, Image]
    base_env: dict[str, str]
    stand_ins: Callable[[dict[str, Any], dict[str, Any], str], StandIns]  # (pod, container spec, node)
    #: every other container's image, chosen from its full reference (the CPU vLLM of the release its tag names);
    #: None: ``images[""]``
    other_image: Callable[[str], Image] | None = None

    def image(self, spec: dict[str, Any]) -> Image:
        argv = [*(spec.get("command") or []), *(spec.get("args") or [])]
        first = Path(argv[0]).name if argv else ""
        reference = str(spec.get("image") or "")
        chosen = self.images.get(first) or self.images.get(repository(reference))
        if chosen is not None:
            return chosen
        return self.other_image(reference) if self.other_image is not None else self.images[""]


def repository(image: str) -> str:
    """An image reference without its tag or digest: ``registry:5000/org/name:tag`` -> ``registry:5000/org/name``."""
    name = image.split("@", 1)[0]
    head, _, tag = name.rpartition(":")
    return head if head and "/" not in tag else name


class VolumeNotReady(runtime.StartError):
    """A volume cannot be mounted yet (unbound claim, missing volume): the kubelet retries soon (FailedMount)."""


def memory_nodes(sysfs: Path = Path("/sys")) -> list[int]:
    """The host's memory nodes that have a meminfo (the container shares the host's kernel, so its own)."""
    found = sysfs.glob("devices/system/node/node*/meminfo")
    return sorted(int(p.parent.name.removeprefix("node")) for p in found if p.parent.name[4:].isdigit())


def restarts(policy: str | None, exit_code: int) -> bool:
    """Whether the kubelet starts a container again after it exited with ``exit_code``."""
    return policy not in ("Never", "OnFailure") or (policy == "OnFailure" and exit_code != 0)


def claim_source(claim: dict[str, Any] | None, volume: dict[str, Any] | None, claim_name: str) -> Path:
    """The host folder of a claim's PersistentVolume; raises VolumeNotReady with the kubelet's kind of message."""
    if claim is None:
        raise VolumeNotReady("ContainerCreating", f'persistentvolumeclaim "{claim_name}" not found')
    phase = (claim.get("status") or {}).get("phase")
    pv_name = (claim.get("spec") or {}).get("volumeName")
    if phase != "Bound" or not pv_name:
        raise VolumeNotReady("ContainerCreating", f'persistentvolumeclaim "{claim_name}" is not bound (phase {phase})')
    if volume is None:
        raise VolumeNotReady("ContainerCreating", f'persistentvolume "{pv_name}" of claim "{claim_name}" not found')
    spec = volume.get("spec") or {}
    path = (spec.get("hostPath") or {}).get("path") or (spec.get("local") or {}).get("path")
    if not path:
        kinds = [k for k in spec if k not in ("accessModes", "capacity", "claimRef", "persistentVolumeReclaimPolicy",
                                              "storageClassName", "volumeMode", "nodeAffinity", "mountOptions")]
        raise runtime.StartError("CreateContainerConfigError",
                                 f'persistentvolume "{pv_name}" ({", ".join(kinds) or "no source"}): the process '
                                 "kubelet mounts hostPath and local PersistentVolumes only")
    if not Path(path).is_dir():
        raise VolumeNotReady("ContainerCreating", f'persistentvolume "{pv_name}": {path} does not exist on the node')
    return Path(path)


def gate_problem(pod: dict[str, Any], conditions: dict[Any, dict[str, Any]]) -> str | None:
    """Why the pod's readiness gates keep it from Ready (None: every gate's condition is True), in the kubelet's
    words (pkg/kubelet/status/generate.go)."""
    for gate in (pod.get("spec") or {}).get("readinessGates") or []:
        kind = gate.get("conditionType")
        found = conditions.get(kind)
        if found is None:
            return f'corresponding condition of pod readiness gate "{kind}" does not exist.'
        if found.get("status") != "True":
            return f'the status of pod readiness gate "{kind}" is not "True", but {found.get("status")}'
    return None


class PodWorker(threading.Thread):
    """Runs one pod until it is deleted; the kubelet hands it the newest pod object via ``update``."""

    def __init__(self, kubelet: Any, pod: dict[str, Any], ip: ipaddress.IPv4Address) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.kubelet = kubelet
        self.pod = pod
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        self.network = PodNetwork(kubelet.bridge, self.uid, ip)
        self.dir: Path = kubelet.pods_dir / f"{self.namespace}_{self.name}_{self.uid}"
        self.containers = [self._container(c, pod) for c in pod["spec"]["containers"]]
        self.started_at = rfc3339_nano()
        self.network_error: str | None = None
        self.stopping = threading.Event()
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._reported: dict[str, Any] | None = None

    @staticmethod
    def _container(spec: dict[str, Any], pod: dict[str, Any]) -> Container:
        previous = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        c = Container(spec, restart_count=int(previous.get(spec["name"], {}).get("restartCount", 0)))
        c.startup = Probe(spec["startupProbe"]) if spec.get("startupProbe") else None
        c.readiness = Probe(spec["readinessProbe"]) if spec.get("readinessProbe") else None
        c.liveness = Probe(spec["livenessProbe"]) if spec.get("livenessProbe") else None
        return c

    def update(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self.pod = pod

    # --- logs (read by the kubelet's HTTP server) ---------------------------------------------------

    def log_path(self, container: str, restart: int) -> Path:
        return self.dir / container / f"{restart}.log"

    def message_path(self, container: str, restart: int) -> Path:
        """The host file behind a container instance's terminationMessagePath (the kubelet's
        ``pods/<uid>/containers/<name>/<id>``), world-writable as the kubelet makes it."""
        return self.dir / container / f"{restart}.termination-log"

    def container(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)

    # --- the loop ------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._setup()
            while not self.stopping.is_set():
                for c in self.containers:
                    self._sync(c)
                self._report()
                self.stopping.wait(TICK)
            self._terminate()
        except Exception as exc:  # a worker must never die silently: say so on the pod and in the log
            self.kubelet.log(f"{self.namespace}/{self.name}: worker failed: {type(exc).__name__}: {exc}")
            self.network_error = f"{type(exc).__name__}: {exc}"
            self._report()
            raise
        finally:
            self.done.set()

    def _setup(self) -> None:
        try:
            self.network.setup()
        except Exception as exc:
            self.network_error = str(exc)
            self.kubelet.event(self.pod, "Warning", "FailedCreatePodSandBox", f"network: {exc}")

    def _sync(self, c: Container) -> None:
        now = time.monotonic()
        if c.terminated:
            return
        if c.instance is not None:
            if c.instance.exited() is not None:
                self._finished(c, now)
            else:
                self._probe(c, now)
            return
        if self.network_error is not None:
            c.waiting = ("ContainerCreating", f"network: {self.network_error}")
            return
        if now < c.restart_at:
            return
        self._start(c)

    def _start(self, c: Container) -> None:
        image = self.kubelet.environment.image(c.spec)
        env_problem = image.problem
        if env_problem:
            # as the kubelet reports an image it cannot pull: ErrImagePull, then ImagePullBackOff while it retries
            reason, message = c.waiting or ("", "")
            failed_before = reason in ("ErrImagePull", "ImagePullBackOff")
            if not failed_before or message != env_problem:  # an Event per new failure, not per retry
                self.kubelet.event(self.pod, "Warning", "Failed", f"Failed to pull image "
                                   f"\"{c.spec.get('image', '')}\": {env_problem}")
            c.waiting = ("ImagePullBackOff" if failed_before else "ErrImagePull", env_problem)
            c.restart_at = time.monotonic() + INITIAL_BACKOFF
            return
        try:
            env = self._env(c)
            limit = quantity_bytes(((c.spec.get("resources") or {}).get("limits") or {}).get("memory"))
            cgroup = MemoryCgroup(self.kubelet.cgroup_parent, f"{self.uid}-{c.name}-{c.restart_count}")
            argv = [*(c.spec.get("command") or []), *(c.spec.get("args") or [])]
            stand_ins = self.kubelet.environment.stand_ins(self.pod, c.spec, self.kubelet_node)
            argv += stand_ins.args
            c.oom_kills_before = 0
            mounts = self._mounts(c) + self._termination_mount(c)
            c.instance = runtime.start(network=self.network, cgroup=cgroup, memory_limit_bytes=limit, argv=argv,
                                       env=env, path=image.path, workdir=self.dir / "workdir",
                                       log_path=self.log_path(c.name, c.restart_count), mounts=mounts,
                                       sysfs_mounts=self._device_memory(c, stand_ins.device_memory_bytes),
                                       cpu=self.kubelet.cpu.container(self.kubelet_node, cgroup.path.name,
                                                                      c.spec.get("resources")))
        except VolumeNotReady as exc:
            if c.waiting != (exc.reason, exc.message):
                self.kubelet.event(self.pod, "Warning", "FailedMount", exc.message)
            c.waiting = (exc.reason, exc.message)
            c.restart_at = time.monotonic() + VOLUME_RETRY_SECONDS
            return
        except runtime.StartError as exc:
            c.waiting = (exc.reason, exc.message)
            c.restart_at = time.monotonic() + INITIAL_BACKOFF
            self.kubelet.event(self.pod, "Warning", "Failed", exc.message)
            return
        c.waiting, c.started, c.ready = None, c.startup is None, False
        for probe in (c.startup, c.readiness, c.liveness):
            if probe is not None:
                probe.failures = probe.successes = 0
                probe.next_at = time.monotonic() + float(probe.spec.get("initialDelaySeconds", 0))
        self.kubelet.event(self.pod, "Normal", "Started", f"Started container {c.name}")

    def _mounts(self, c: Container) -> tuple[runtime.Mount, ...]:
        """The container's volume mounts: emptyDir and persistentVolumeClaim volumes."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        mounts = []
        for mount in c.spec.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            if "projected" in volume and mount.get("mountPath") == SERVICE_ACCOUNT_MOUNT:
                continue  # the admission-injected token: nothing here talks to the API server from a pod
            read_only = bool(mount.get("readOnly"))
            sub_path = str(mount.get("subPath") or "")
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise runtime.StartError("CreateContainerConfigError",
                                         f"volume {mount['name']!r}: subPath {sub_path!r} must be a relative path "
                                         "without '..'")
            if "persistentVolumeClaim" in volume:
                source = volume["persistentVolumeClaim"] or {}
                folder = self._claim_folder(str(source.get("claimName", "")))
                read_only = read_only or bool(source.get("readOnly"))
                target = folder / sub_path if sub_path else folder
                if sub_path and not target.exists() and read_only:
                    raise VolumeNotReady("CreateContainerConfigError",
                                         f"volume {mount['name']!r}: subPath {sub_path!r} does not exist on the "
                                         "read-only volume")
                mounts.append(runtime.Mount(target=mount["mountPath"], source=target, read_only=read_only,
                                            create_source=bool(sub_path)))
                continue
            if "emptyDir" not in volume:
                kind = next((k for k in volume if k != "name"), "missing")
                raise runtime.StartError("CreateContainerConfigError",
                                         f"volume {mount['name']!r} ({kind}): the process kubelet mounts emptyDir "
                                         "and persistentVolumeClaim volumes only")
            empty_dir = volume["emptyDir"] or {}
            memory = empty_dir.get("medium") == "Memory"
            folder = self.dir / "volumes" / mount["name"]
            mounts.append(runtime.Mount(
                target=mount["mountPath"], source=None if memory else (folder / sub_path if sub_path else folder),
                size_bytes=quantity_bytes(empty_dir.get("sizeLimit")), read_only=read_only))
        return tuple(mounts)

    def _device_memory(self, c: Container, total_bytes: int | None) -> tuple[runtime.Mount, ...]:
        """A simulated device's memory (``StandIns.device_memory_bytes``): each memory node's meminfo, bound
        over the container's /sys, says ``total_bytes``, all free. vLLM's CPU worker then sizes its KV cache as
        a GPU worker does: the budget (that size x gpu_memory_utilization) less what loading used."""
        if total_bytes is None:
            return ()
        mounts = []
        for node in memory_nodes():
            source = self.dir / c.name / f"{c.restart_count}.node{node}.meminfo"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text(runtime.simulated_meminfo(node, total_bytes))
            mounts.append(runtime.Mount(target=runtime.NODE_MEMINFO.format(node=node), source=source, file=True,
                                        create_source=False))
        return tuple(mounts)

    def _termination_mount(self, c: Container) -> tuple[runtime.Mount, ...]:
        """The termination message file: fresh and empty for each instance, bound last (over any volume)."""
        target = str(c.spec.get("terminationMessagePath") or "")
        if not target:
            return ()
        if not target.startswith("/"):
            raise runtime.StartError("CreateContainerConfigError",
                                     f"terminationMessagePath {target!r} must be an absolute path")
        host = self.message_path(c.name, c.restart_count)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(b"")
        host.chmod(0o666)
        return (runtime.Mount(target=target, source=host, file=True, create_source=False),)

    def _claim_folder(self, claim_name: str) -> Path:
        code, claim = self.kubelet.api.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim_name}")
        claim = claim if code == 200 and isinstance(claim, dict) else None
        volume = None
        pv_name = ((claim or {}).get("spec") or {}).get("volumeName")
        if pv_name:
            code, body = self.kubelet.api.request("GET", f"/api/v1/persistentvolumes/{pv_name}")
            volume = body if code == 200 and isinstance(body, dict) else None
        return claim_source(claim, volume, claim_name)

    def _env(self, c: Container) -> dict[str, str]:
        env = dict(self.kubelet.environment.base_env)
        # the image's HOME: empty at every start, as a fresh container's writable layer (never the host's)
        home = self.dir / "rootfs" / f"{c.name}-{c.restart_count}" / "root"
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        env["HOME"] = str(home)
        for var in c.spec.get("env") or []:
            if "value" in var:
                env[var["name"]] = str(var["value"])
            elif "valueFrom" in var:
                env[var["name"]] = self._value_from(var["valueFrom"])
        return env

    def _value_from(self, source: dict[str, Any]) -> str:
        if "secretKeyRef" in source or "configMapKeyRef" in source:
            kind, ref = ("secrets", source["secretKeyRef"]) if "secretKeyRef" in source else (
                "configmaps", source["configMapKeyRef"])
            code, obj = self.kubelet.api.request("GET", f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
            data = (obj or {}).get("data") or {} if code == 200 else {}
            if ref.get("key") not in data:
                if ref.get("optional"):
                    return ""
                what = "secret" if kind == "secrets" else "configmap"
                missing = (f'{what} "{ref["name"]}" not found' if code == 404 else
                           f"couldn't find key {ref.get('key')} in {what} {self.namespace}/{ref['name']}")
                raise runtime.StartError("CreateContainerConfigError", missing)
            value = data[ref["key"]]
            return base64.b64decode(value).decode() if kind == "secrets" else str(value)
        field = (source.get("fieldRef") or {}).get("fieldPath", "")
        fields: dict[str, str] = {
            "metadata.name": self.name, "metadata.namespace": self.namespace, "metadata.uid": self.uid,
            "spec.nodeName": self.kubelet_node, "status.podIP": str(self.network.ip), "status.hostIP": "127.0.0.1"}
        return fields.get(str(field), "")

    @property
    def kubelet_node(self) -> str:
        return str(self.pod["spec"].get("nodeName", ""))

    def _probe(self, c: Container, now: float) -> None:
        assert c.instance is not None
        if not c.started:
            probe = c.startup
            if probe is not None and probe.due(now):
                probe.record(self._http_ok(c, probe.spec), now)
                if probe.successes:
                    c.started = True
                elif probe.failures >= probe.failure_threshold:
                    self._kill(c, "Startup probe failed")
            return
        if c.readiness is not None and c.readiness.due(now):
            ok = self._http_ok(c, c.readiness.spec)
            c.readiness.record(ok, now)
            if ok:
                c.ready = True
            elif c.readiness.failures >= c.readiness.failure_threshold:
                c.ready = False
        elif c.readiness is None:
            c.ready = True
        if c.liveness is not None and c.liveness.due(now):
            c.liveness.record(self._http_ok(c, c.liveness.spec), now)
            if c.liveness.failures >= c.liveness.failure_threshold:
                self._kill(c, "Liveness probe failed")

    def _http_ok(self, c: Container, spec: dict[str, Any]) -> bool:
        get = spec.get("httpGet") or {}
        try:
            url = f"http://{self.network.ip}:{c.port(get.get('port'))}{get.get('path', '/')}"
        except ValueError:
            return False
        try:
            with urllib.request.urlopen(url, timeout=float(spec.get("timeoutSeconds", 1))) as response:
                return 200 <= int(response.status) < 400
        except urllib.error.HTTPError as exc:
            return 200 <= exc.code < 400
        except OSError:
            return False

    def _kill(self, c: Container, why: str) -> None:
        assert c.instance is not None
        self.kubelet.event(self.pod, "Warning", "Unhealthy", why)
        self.kubelet.event(self.pod, "Normal", "Killing", f"Container {c.name} failed its probe, will be restarted")
        runtime.stop(c.instance, self._grace())

    def _finished(self, c: Container, now: float) -> None:
        assert c.instance is not None
        ended = runtime.reap(c.instance, c.oom_kills_before)
        c.instance, c.started, c.ready = None, False, False
        log = self.log_path(c.name, c.restart_count)
        written = message_file(self.message_path(c.name, c.restart_count)) if c.spec.get(
            "terminationMessagePath") else ""
        fallback = (not written and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
                    and ended.exit_code != 0)
        c.earlier_exit = (c.last_exit, c.last_message) if c.last_exit is not None else None
        c.last_exit, c.last_message = ended, termination_message(log) if fallback else written
        self.kubelet.log(f"{self.namespace}/{self.name}/{c.name}: exited {ended.exit_code} ({ended.reason}), "
                         f"peak memory {ended.peak_memory_bytes / 2**20:.0f} MiB")
        if ended.reason == "OOMKilled":
            self.kubelet.event(self.pod, "Warning", "OOMKilled", f"Container {c.name} was OOM-killed (memory limit)")
        if not restarts(self.pod["spec"].get("restartPolicy"), ended.exit_code):
            c.terminated, c.waiting = True, None
            if all(other.terminated for other in self.containers):
                self.network.teardown()  # the sandbox goes; the pod object, its status and logs stay
            return
        wait, c.backoff = crash_backoff(c.backoff, c.backoff_updated, now)
        c.backoff_updated = now
        c.restart_at = now + wait
        c.restart_count += 1
        if wait:
            c.waiting = ("CrashLoopBackOff", f"back-off {wait:.0f}s restarting failed container={c.name} "
                                             f"pod={self.name}_{self.namespace}({self.uid})")
            self.kubelet.event(self.pod, "Warning", "BackOff", "Back-off restarting failed container "
                                                               f"{c.name} in pod {self.name}_{self.namespace}")
        else:
            c.waiting = ("ContainerCreating", "")

    def _grace(self) -> float:
        seconds = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return min(float(seconds if seconds is not None else 30), MAX_GRACE_SECONDS)

    def _deletion_grace(self) -> float:
        """The grace period of the pod's deletion: the one the delete asked for (metadata.deletionGracePeriodSeconds),
        else the pod's terminationGracePeriodSeconds, as the kubelet takes it; capped."""
        seconds = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if seconds is None:
            seconds = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return min(float(seconds if seconds is not None else 30), MAX_DELETION_GRACE_SECONDS)

    def _stop_container(self, c: Container, deadline: float) -> None:
        """The kubelet's killContainer on a pod's deletion: the exec preStop hook (bounded by the grace period),
        then SIGTERM to the main process and SIGKILL at the deadline, which counts from the deletion's start."""
        assert c.instance is not None
        hook = ((c.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
        if hook.get("command"):
            failed = runtime.exec_hook(c.instance, [str(part) for part in hook["command"]],
                                       deadline - time.monotonic())
            if failed is not None:
                self.kubelet.event(self.pod, "Warning", "FailedPreStopHook",
                                   f"PreStopHook failed: {failed}")
        runtime.stop(c.instance, max(deadline - time.monotonic(), MIN_GRACE_AFTER_HOOK_SECONDS))

    def _terminate(self) -> None:
        began = time.monotonic()
        deadline = began + self._deletion_grace()
        running = [c for c in self.containers if c.instance is not None]
        stoppers = [threading.Thread(target=self._stop_container, args=(c, deadline), daemon=True) for c in running]
        for thread in stoppers:  # every container at once, each with the whole grace period, as the kubelet does
            thread.start()
        for thread in stoppers:
            thread.join()
        if running:  # how long the preStop hooks and the drain took: a slow teardown is read here
            self.kubelet.log(f"{self.namespace}/{self.name}: containers stopped {time.monotonic() - began:.1f}s "
                             "after the deletion was seen")
        for c in running:
            assert c.instance is not None
            runtime.reap(c.instance, c.oom_kills_before)
            c.instance = None
        reaped = time.monotonic()
        self.kubelet.forget_targets(self)
        self.network.teardown()
        shutil.rmtree(self.dir, ignore_errors=True)  # logs and emptyDir volumes go with the pod
        self.kubelet.log(f"{self.namespace}/{self.name}: torn down {time.monotonic() - began:.1f}s after the deletion "
                         f"was seen (reaped at {reaped - began:.1f}s)")

    # --- status ----------------------------------------------------------------------------------------

    def _status(self) -> dict[str, Any]:
        statuses = [container_status(c) for c in self.containers]
        all_ready = all(c.ready for c in self.containers)
        running = any(c.instance is not None or c.restart_count or c.terminated for c in self.containers)
        finished = all(c.terminated for c in self.containers)
        succeeded = finished and all(c.last_exit is not None and c.last_exit.exit_code == 0 for c in self.containers)
        now = rfc3339_nano()
        previous = {c.get("type"): c for c in (self.pod.get("status") or {}).get("conditions") or []}

        def condition(type_: str, ok: bool, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
            status = "True" if ok else "False"
            old = previous.get(type_) or {}
            since = old.get("lastTransitionTime") if old.get("status") == status else now
            # reason and message always named (null: none), so the strategic merge removes a stale one
            out = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": since,
                   "reason": reason if reason and not ok else None,
                   "message": message if reason and not ok and message else None}
            return out

        not_ready = "PodCompleted" if finished else "ContainersNotReady"
        gate = gate_problem(self.pod, previous) if all_ready else None
        conditions = [
            condition("PodReadyToStartContainers", self.network_error is None and not finished),
            condition("Initialized", True),
            condition("Ready", all_ready and gate is None, not_ready if gate is None else "ReadinessGatesNotReady",
                      gate),
            condition("ContainersReady", all_ready, not_ready),
        ]
        if "PodScheduled" in previous:
            conditions.append(previous["PodScheduled"])
        status: dict[str, Any] = {
            "phase": ("Succeeded" if succeeded else "Failed") if finished else "Running" if running else "Pending",
            "conditions": conditions,
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.started_at,
            "containerStatuses": statuses,
        }
        if self.network_error is None:
            status["podIP"] = str(self.network.ip)
            status["podIPs"] = [{"ip": str(self.network.ip)}]
        return status

    def _report(self) -> None:
        status = self._status()
        if status != self._reported:
            # a strategic merge: conditions merge by type, so those others write (readiness gates) stay
            code, body = self.kubelet.api.strategic_patch(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status", {"status": status})
            if code == 200:
                self._reported = status
                self.pod = body if isinstance(body, dict) else self.pod
            elif code != 404:
                self.kubelet.log(f"{self.namespace}/{self.name}: status patch {code}: {str(body)[:300]}")
        self.kubelet.publish_targets(self)


def container_status(c: Container) -> dict[str, Any]:
    """One container's entry of ``status.containerStatuses``, as the kubelet writes it."""
    state: dict[str, Any]
    if c.instance is not None:
        state = {"running": {"startedAt": c.instance.started_at}}
    elif c.terminated and c.last_exit is not None:
        state = {"terminated": _terminated(c.last_exit, c.last_message)}
    else:
        reason, message = c.waiting or ("ContainerCreating", "")
        state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    last: dict[str, Any] = {}
    if c.last_exit is not None and not c.terminated:
        last = {"terminated": _terminated(c.last_exit, c.last_message)}
    elif c.terminated and c.earlier_exit is not None:
        last = {"terminated": _terminated(*c.earlier_exit)}
    return {"name": c.name, "image": c.spec.get("image", ""), "imageID": "", "ready": c.ready,
            "started": c.instance is not None and c.started, "restartCount": c.restart_count,
            "state": state, "lastState": last,
            **({"containerID": c.instance.container_id} if c.instance is not None else {})}


def _terminated(ended: runtime.Exit, message: str) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": ended.exit_code, "reason": ended.reason,
                                  "startedAt": ended.started_at, "finishedAt": ended.finished_at,
                                  "containerID": ended.container_id}
    if message:
        terminated["message"] = message
    return terminated
