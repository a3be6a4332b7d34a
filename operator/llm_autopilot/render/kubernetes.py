"""Pure builders: plan + spec -> the Deployment, Service and PodDisruptionBudget that serve it.

Each object carries ``llm-autopilot.io/input-hash``, a hash of the object as built: the shell skips
the write when the live object already has it (as prometheus-operator does), so a resync that
changes nothing writes nothing. The pod template carries the plan's hash, so a new plan rolls pods.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_autopilot.api import GROUP, KIND, VERSION
from llm_autopilot.api.kubernetes_rules import parse_quantity
from llm_autopilot.api.v1alpha1 import HUB_TOKEN_ENV, LLMDeploymentSpec
from llm_autopilot.catalog.gpus import GFD_PRODUCT
from llm_autopilot.domain.burn_in import BURN_IN_GATE
from llm_autopilot.domain.drain import pre_stop_seconds, termination_grace_seconds
from llm_autopilot.planner.plan import Plan
from llm_autopilot.render import cache, compile_cache, lora_volumes, model_volume, rollout
from llm_autopilot.render.compile_cache import CompileCacheVolume
from llm_autopilot.render.model_volume import downloads
from llm_autopilot.render.vllm_args import VLLM_PORT, without_shutdown_timeout
from llm_autopilot.vllm.versions import RUNTIME_LORA_UPDATING_ENV

INPUT_HASH = f"{GROUP}/input-hash"
PLAN_HASH = f"{GROUP}/plan-hash"
#: on the Deployment (not its pod template, so it rolls nothing): the vLLM version its pods were planned for; a
#: canary (render/canary.py) compares the fleet's release with the spec's by it
VLLM_VERSION = f"{GROUP}/vllm-version"
OWNER_LABEL = f"{GROUP}/deployment"
GPU_RESOURCE = "nvidia.com/gpu"
MANAGER = "llm-autopilot"
CONTAINER = "vllm"
#: The startup probe's period; its length comes from the weights' bytes (render/rollout.py).
_STARTUP_PERIOD = rollout.STARTUP_PERIOD_SECONDS

# Pod security: the pods meet the "restricted" Pod Security Standard. The upstream vllm/vllm-openai image runs
# as root with its caches under /root; as a non-root user it needs a writable HOME (Hugging Face, vLLM, Triton,
# torch.compile and numba all write under ~/.cache and ~/.config), hence the emptyDir below. 65534 ("nobody")
# is in the passwd file of every Debian/Ubuntu-based image, so libraries that look the user name up (torch's
# getpass.getuser()) find one.
RUN_AS_USER = 65534
HOME_DIR = "/home/vllm"


def _pod_security_context(*, writes_volume: bool = False) -> dict[str, Any]:
    """``writes_volume``: the pod writes a PVC (the compile cache), which the kubelet makes its group's by fsGroup,
    as the model cache's download Job does; OnRootMismatch: a volume already the group's is not walked again at
    every start (a full cache holds many files)."""
    context: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                               "seccompProfile": {"type": "RuntimeDefault"}}
    if writes_volume:
        context |= {"fsGroup": RUN_AS_USER, "fsGroupChangePolicy": "OnRootMismatch"}
    return context


def _container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass(frozen=True)
class Owner:
    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class WorkloadInputs:
    owner: Owner
    spec: LLMDeploymentSpec
    plan: Plan
    args: tuple[str, ...]
    image: str
    #: GPU Feature Discovery product label values the pods may run on
    node_products: tuple[str, ...]
    #: remediation's overrides of spec.replicas and of the container memory limit
    replicas: int | None = None
    memory_limit_gib: float | None = None
    #: host memory vLLM keeps on purpose (CPU offload, KV offloading, multimodal caches), added to request and limit
    host_memory_gib: float = 0.0
    #: Prometheus KEDA queries (spec.autoscaling.prometheusAddress, else the operator's)
    prometheus_address: str | None = None
    #: the pool holds one more replica: roll out by surging (render/rollout.py)
    surge: bool = False
    #: the model cache's PVC the pods load from (spec.model.cache), and whether its download is still incomplete
    #: (then the Deployment holds at 0 replicas: no pod starts on a partial cache)
    cache_claim: str | None = None
    held: bool = False
    #: LoRA adapters are loaded and unloaded on the running pods (desired/lora_sync.py): vLLM's runtime API is on
    lora_runtime: bool = False
    #: the startup probe's length chosen for this plan (desired/startup_probe.py); None: the formula's
    startup_budget: int | None = None
    #: the PVC and folder of vLLM's compile caches (spec.vllm.compileCache); None: they stay in the emptyDir HOME
    compile_cache: CompileCacheVolume | None = None

    @property
    def downloads_weights(self) -> bool:
        """The pod fetches the weights itself (an hf:// source without the model cache)."""
        return self.cache_claim is None and downloads(self.spec)

    @property
    def formula_startup_seconds(self) -> int:
        """The formula's startup probe: the weights' load (and download, when the pod fetches them)."""
        return rollout.startup_seconds(self.plan.config, downloads=self.downloads_weights)

    @property
    def startup_seconds(self) -> int:
        """The startup probe's length: the one chosen for the plan, else the formula's."""
        return self.startup_budget if self.startup_budget is not None else self.formula_startup_seconds

    @property
    def replica_count(self) -> int:
        """Replicas to run: remediation's override unless KEDA drives them, else the spec's."""
        if self.replicas is None or self.spec.autoscaling is not None:
            return self.spec.replicas
        return self.replicas


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


#: the label every object of one LLMDeployment carries, with its name: its pods are found by it
INSTANCE_LABEL = "app.kubernetes.io/instance"


def instance_selector(name: str) -> str:
    """The label selector of the pods (and Jobs) of the LLMDeployment ``name``."""
    return f"{INSTANCE_LABEL}={name}"


def labels(owner: Owner) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        INSTANCE_LABEL: owner.name,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/part-of": "llm-autopilot",
        "app.kubernetes.io/managed-by": MANAGER,
        OWNER_LABEL: owner.name,
    }


def selector(owner: Owner) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", INSTANCE_LABEL: owner.name}


def _metadata(owner: Owner) -> dict[str, Any]:
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": labels(owner),
        "ownerReferences": [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": owner.name, "uid": owner.uid,
            "controller": True, "blockOwnerDeletion": True,
        }],
    }


def _with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})[INPUT_HASH] = content_hash(obj)
    return obj


def _gib(value: float) -> str:
    return f"{max(1, round(value))}Gi"


def memory_quantity(gib: float) -> str:
    """A memory size as a quantity: whole GiB as such, anything else up to the next MiB (remediation grows
    limits by half, 1Gi -> 1536Mi -> 2304Mi)."""
    mib = math.ceil(gib * 1024)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def quantity_gib(text: str) -> float:
    """A memory quantity ("36Gi", "192G", "1024Mi", "1e9", bytes) in GiB; 0 when it cannot be read."""
    try:
        return float(parse_quantity(text) / 2**30)
    except ValueError:
        return 0.0


def memory_limit_gib(inputs: WorkloadInputs) -> float:
    """The container memory limit the objects set (GiB), for remediation's host-OOM rung."""
    return quantity_gib(str(container_resources(inputs)["limits"].get("memory", "0")))


def _at_most(default: str, limit: int | str | None) -> int | str:
    """A default request, lowered to the spec's limit when that is smaller (a request above its limit is invalid)."""
    if limit is not None and parse_quantity(limit) < parse_quantity(default):
        return limit
    return default


def container_resources(inputs: WorkloadInputs) -> dict[str, dict[str, Any]]:
    """GPUs from the plan (one pod's share when a replica spans nodes); CPU/memory from the spec, else a default
    that scales with the GPU count; plus the host memory vLLM uses on purpose."""
    gpus = inputs.plan.config.gpus_per_pod
    spec_resources = inputs.spec.resources
    requests: dict[str, Any] = {"cpu": str(2 * gpus), "memory": _gib(16 + 8 * gpus)}
    limits: dict[str, Any] = {"memory": _gib(1.5 * (16 + 8 * gpus))}
    if spec_resources is not None:
        limits = spec_resources.limits.quantities() if spec_resources.limits else {}
        if spec_resources.requests is not None:
            requests = spec_resources.requests.quantities()
        else:
            requests = {name: _at_most(value, limits.get(name)) for name, value in requests.items()}
    if inputs.memory_limit_gib is not None:
        # remediation raises the limit; never below the request, which the API server would refuse
        limits["memory"] = memory_quantity(inputs.memory_limit_gib)
        if "memory" in requests and parse_quantity(requests["memory"]) > parse_quantity(limits["memory"]):
            limits["memory"] = requests["memory"]
    if inputs.host_memory_gib > 0:
        _add_host_memory(requests, limits, inputs.host_memory_gib, raised=inputs.memory_limit_gib is not None)
    gpus = inputs.plan.config.gpus_per_pod
    requests[GPU_RESOURCE] = str(gpus)  # quantities as the API server returns them
    limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def _add_host_memory(requests: dict[str, Any], limits: dict[str, Any], gib: float, *, raised: bool) -> None:
    """Host memory vLLM uses on purpose, on top of the request and the limit (a limit remediation raised was
    measured from a limit that already held it). No memory limit stays no limit."""
    requests["memory"] = memory_quantity(quantity_gib(str(requests.get("memory", "0"))) + gib)
    if "memory" in limits and not raised:
        limits["memory"] = memory_quantity(quantity_gib(str(limits["memory"])) + gib)
    if "memory" in limits and parse_quantity(requests["memory"]) > parse_quantity(limits["memory"]):
        limits["memory"] = requests["memory"]


def _env(inputs: WorkloadInputs) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    ref = inputs.spec.model.hub_token_secret_ref
    if ref is not None:  # the token never appears in the object, only a reference to the Secret
        env.append({"name": HUB_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    for var in inputs.spec.vllm.env:
        env.append(var.model_dump(by_alias=True, exclude_none=True))
    if inputs.lora_runtime and all(var.name != RUNTIME_LORA_UPDATING_ENV for var in inputs.spec.vllm.env):
        env.append({"name": RUNTIME_LORA_UPDATING_ENV, "value": "true"})
    return env


def _home_env(inputs: WorkloadInputs) -> list[dict[str, Any]]:
    """HOME on the writable emptyDir, unless spec.vllm.env sets it (a duplicate name would be refused)."""
    if any(var.name == "HOME" for var in inputs.spec.vllm.env):
        return []
    return [{"name": "HOME", "value": HOME_DIR}]


def _compile_cache_env(inputs: WorkloadInputs) -> list[dict[str, Any]]:
    if inputs.compile_cache is None:
        return []
    return compile_cache.env(inputs.compile_cache, {var.name for var in inputs.spec.vllm.env})


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}


def _affinity(inputs: WorkloadInputs) -> dict[str, Any] | None:
    """Nodes with one of the planned GPU products; None for a GPU known only by its memory (spec.gpu.memoryGiB),
    where an `In` with no values would be rejected: spec.gpu.nodeSelector pins those pods."""
    if not inputs.node_products:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
        "matchExpressions": [{"key": GFD_PRODUCT, "operator": "In", "values": sorted(inputs.node_products)}],
    }]}}}


def pre_stop_sleep(inputs: WorkloadInputs) -> list[str] | None:
    """The preStop hook's command: a wait while the pod leaves the Service's endpoints, so vLLM gets SIGTERM (and
    refuses new requests) only once none are routed to it. An exec hook (`sleep` is in every image with a shell).
    None: no drain."""
    seconds = pre_stop_seconds(inputs.spec.vllm.drain_seconds)
    return ["sleep", str(seconds)] if seconds else None


def container(inputs: WorkloadInputs, *, command: list[str], args: list[str], probes: dict[str, Any],
              env: Sequence[dict[str, Any]] = (), pre_stop: list[str] | None = None) -> dict[str, Any]:
    """The vLLM container; ``pre_stop`` replaces the preStop command (:func:`pre_stop_sleep`) where the pod
    needs another (a group's worker waits for its leader)."""
    hook = pre_stop or pre_stop_sleep(inputs)
    lifecycle = {"lifecycle": {"preStop": {"exec": {"command": hook}}}} if hook else {}
    return {
        "name": CONTAINER,
        "image": inputs.image,
        "command": command,
        "args": args,
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "env": [*_env(inputs), *_home_env(inputs), *_compile_cache_env(inputs), *env],
        "resources": container_resources(inputs),
        "securityContext": _container_security_context(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "home", "mountPath": HOME_DIR},
                         *model_volume.mounts(inputs.spec), *lora_volumes.mounts(inputs.spec),
                         *([cache.pod_mount()] if inputs.cache_claim else []),
                         *([compile_cache.pod_mount()] if inputs.compile_cache else [])],
        **probes,
        **lifecycle,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def http_probes(startup_seconds: int) -> dict[str, Any]:
    return {"startupProbe": _probe("/health", _STARTUP_PERIOD, rollout.startup_probe_failures(startup_seconds)),
            "readinessProbe": _probe("/health", 5, 3), "livenessProbe": _probe("/health", 10, 3)}


def pod_spec(inputs: WorkloadInputs, vllm: dict[str, Any]) -> dict[str, Any]:
    """The pod around one vLLM container: volumes, security, placement."""
    spec = inputs.spec
    gpus = inputs.plan.config.gpus_per_pod
    pod: dict[str, Any] = {
        "containers": [vllm],
        # NCCL and vLLM's workers exchange tensors through shared memory; the home holds the downloaded model
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _gib(max(2, 2 * gpus))}},
                    {"name": "home", "emptyDir": {}}, *model_volume.volumes(spec), *lora_volumes.volumes(spec),
                    *([cache.pod_volume(inputs.cache_claim)] if inputs.cache_claim else []),
                    *([compile_cache.pod_volume(inputs.compile_cache)] if inputs.compile_cache else [])],
        # the preStop wait, the drain (spec.vllm.drainSeconds) and vLLM's teardown (domain/drain.py)
        "terminationGracePeriodSeconds": termination_grace_seconds(spec.vllm.drain_seconds),
        # vLLM never calls the Kubernetes API: the model code it runs gets no ServiceAccount token
        "automountServiceAccountToken": False,
        "securityContext": _pod_security_context(writes_volume=inputs.compile_cache is not None),
    }
    if inputs.cache_claim:  # the pod goes no further on a cache without its completion marker
        pod["initContainers"] = [cache.marker_check(inputs.image, spec)]
    if spec.gpu.node_selector:
        pod["nodeSelector"] = dict(spec.gpu.node_selector)
    if spec.gpu.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.gpu.tolerations]
    affinity = _affinity(inputs)
    if affinity is not None:
        pod["affinity"] = affinity
    return pod


def plan_hash(inputs: WorkloadInputs) -> str:
    """What identifies the pods of one plan (remediation reads only their failures as evidence): vLLM's args and,
    when remediation raised it, the container memory limit. Without the limit, a memory step left the old pods
    (same args) counted as the new plan's, and their next OOM kill took a second step the new pods never earned.
    The limit enters only when it is an override, so a workload without one keeps the hash it always had.
    ``--shutdown-timeout`` never enters: how long a stopping pod drains changes nothing the plan serves, so a
    changed spec.vllm.drainSeconds rolls the pods (their template changes) without making them a new plan whose
    verification, remediation evidence and recovery start over."""
    args = without_shutdown_timeout(inputs.args)
    if inputs.memory_limit_gib is None:
        return content_hash(args)
    return content_hash([*args, {"memoryLimitGiB": inputs.memory_limit_gib}])


def metadata(owner: Owner, name: str | None = None, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An owned object's metadata (named after the LLMDeployment unless ``name`` says otherwise)."""
    meta = _metadata(owner)
    if name is not None:
        meta["name"] = name
    if extra_labels:
        meta["labels"].update(extra_labels)
    return meta


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    return _with_hash(obj)


def deployment(inputs: WorkloadInputs, *, replicas: int | None = None) -> dict[str, Any]:
    owner = inputs.owner
    vllm = container(inputs, command=["vllm", "serve"], args=list(inputs.args),
                     probes=http_probes(inputs.startup_seconds))
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**_metadata(owner), "annotations": {VLLM_VERSION: str(inputs.plan.config.vllm.version)}},
        "spec": {
            "replicas": 0 if inputs.held else inputs.replica_count if replicas is None else replicas,
            "selector": {"matchLabels": selector(owner)},
            # surge onto a free GPU when the pool has one, else replace pods one at a time (render/rollout.py)
            "strategy": rollout.strategy(inputs.surge),
            "template": {
                "metadata": {"labels": labels(owner), "annotations": {PLAN_HASH: plan_hash(inputs)}},
                "spec": burn_in_gate(inputs, pod_spec(inputs, vllm)),
            },
        },
    }
    return _with_hash(obj)


def burn_in_gate(inputs: WorkloadInputs, spec: dict[str, Any]) -> dict[str, Any]:
    """With spec.verification.burnIn, the pod is Ready (in the Services) only once the operator's burn-in passed."""
    if inputs.spec.verification.burn_in is None:
        return spec
    return {**spec, "readinessGates": [{"conditionType": BURN_IN_GATE}]}


def service(inputs: WorkloadInputs, pod_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The clients' Service: every pod, or with groups only their leaders (the workers serve no API)."""
    return _with_hash({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(inputs.owner),
        "spec": {
            "selector": pod_selector or selector(inputs.owner),
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    })


def pod_disruption_budget(inputs: WorkloadInputs) -> dict[str, Any]:
    return _with_hash({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(inputs.owner),
        # one pod at a time; never 0, which would block node drains for a single replica forever. A pod of a
        # group across nodes takes its whole group down, so this is also one group at a time.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(inputs.owner)}},
    })


def label_selector(match: dict[str, str]) -> str:
    """A matchLabels selector as a string (the scale subresource's status.selector)."""
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def workload(inputs: WorkloadInputs) -> list[dict[str, Any]]:
    return [deployment(inputs), service(inputs), pod_disruption_budget(inputs)]
