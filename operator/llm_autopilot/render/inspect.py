"""The inspect Job of a pvc:// source: read config.json and the weights' size on the user's volume. Pure.

The operator does not mount volumes, so it asks the cluster to: a Job in the LLMDeployment's namespace mounts
the claim read-only at :data:`MOUNT` and runs ``llm-autopilot inspect-volume`` in the operator's own image
(as the cache's download Job does), on the nodes the vLLM pods may run on (the spec's nodeSelector and
tolerations: a node-local volume is mounted where the pods will mount it). The report comes back as the
container's termination message (api/inspection.py): the pod needs no Kubernetes credentials.

One Job per (source, claim uid): a changed source or a re-created claim is inspected again. The Job is owned
by the LLMDeployment (deleted with it), runs once (``backoffLimit: 0``: the same folder gives the same answer),
and is deleted by the TTL controller :data:`TTL_SECONDS` after it finished: the result is kept in the status,
and a failed inspection is tried again after that long (so a fixed volume is seen without a spec change).
"""

from __future__ import annotations

import hashlib
from typing import Any

from llm_autopilot.api import GROUP, KIND, VERSION
from llm_autopilot.api.sources import PVCSource
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.render.kubernetes import INSTANCE_LABEL, Owner

MOUNT = "/model"
VOLUME = "model"
CONTAINER = "inspect"
INSPECT_LABEL = f"{GROUP}/inspect"
#: how long a finished inspect Job stays (its pod's log and status readable), and the retry period of a failure
TTL_SECONDS = 120
#: how long the container may run: reading two JSON files and listing a folder
DEADLINE_SECONDS = 300


def folder(source: PVCSource) -> str:
    """Where the model's folder is inside the inspect container (and its name in messages)."""
    return f"{MOUNT}/{source.path}" if source.path else MOUNT


def key(source: PVCSource, claim_uid: str) -> str:
    return hashlib.sha256(f"{source.uri}\0{claim_uid}".encode()).hexdigest()[:10]


def job_name(owner: Owner, source: PVCSource, claim_uid: str) -> str:
    suffix = f"-inspect-{key(source, claim_uid)}"
    return owner.name[:63 - len(suffix)].rstrip("-.") + suffix


def labels(owner: Owner) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "llm-autopilot", "app.kubernetes.io/component": "source-inspection",
            INSTANCE_LABEL: owner.name, INSPECT_LABEL: owner.name}


def job(owner: Owner, spec: LLMDeploymentSpec, source: PVCSource, claim_uid: str, image: str) -> dict[str, Any]:
    return _job(owner, spec, source, claim_uid, image, name=job_name(owner, source, claim_uid),
                command=["llm-autopilot"], args=["inspect-volume", folder(source)])


# --- a pvc:// LoRA adapter: its adapter_config.json -------------------------------------------------------

#: what the adapter's inspect container runs: POSIX sh, tr and wc, in the operator's image. It checks the folder
#: (adapter_config.json and the weights are there and readable) and hands adapter_config.json back, its blank space
#: squeezed, as the termination message; the operator parses it (api/inspection.py::parse_adapter_report). A
#: failure is one line, "error: ...". The rank and the base model need nothing else, so no code of the operator's
#: runs in the pod, and any version of its image reads any adapter.
ADAPTER_SCRIPT = r"""set -u
dir="$1"
config="$dir/adapter_config.json"
log="${TERMINATION_LOG:-/dev/termination-log}"
fail() { printf 'error: %s\n' "$*" >&2; printf 'error: %s\n' "$*" > "$log" 2>/dev/null; exit 2; }
[ -d "$dir" ] || fail "$dir does not exist on the volume (or is not a folder)"
[ -f "$config" ] || fail "no adapter_config.json in $dir: the path must be the adapter's folder" \
  "(the one holding adapter_config.json and adapter_model.safetensors)"
[ -r "$config" ] || fail "$config is not readable (permission denied); make it world-readable (chmod a+r):" \
  "the inspection runs as a non-root user"
[ -f "$dir/adapter_model.safetensors" ] || [ -f "$dir/adapter_model.bin" ] || fail "no adapter_model.safetensors" \
  "(or adapter_model.bin) in $dir: the adapter's weights are not there (a partial copy?)"
compact=$(tr -s ' \t\r\n' '    ' < "$config") || fail "cannot read $config"
size=$(printf '%s' "$compact" | wc -c)
[ "$size" -le 4000 ] || fail "$config takes $size bytes without its blank space, more than the 4096 bytes a" \
  "termination message holds: remove what vLLM does not read from it (alpha_pattern, long rank_pattern maps)"
printf '%s' "$compact" > "$log" 2>/dev/null
printf '%s\n' "$compact"
"""
ADAPTER_LABEL = f"{GROUP}/lora-adapter"


def adapter_key(source: PVCSource, claim_uid: str) -> str:
    return hashlib.sha256(f"lora\0{source.uri}\0{claim_uid}".encode()).hexdigest()[:10]


def adapter_job_name(owner: Owner, source: PVCSource, claim_uid: str) -> str:
    suffix = f"-lora-inspect-{adapter_key(source, claim_uid)}"
    return owner.name[:63 - len(suffix)].rstrip("-.") + suffix


def adapter_job(owner: Owner, spec: LLMDeploymentSpec, adapter: str, source: PVCSource, claim_uid: str,
                image: str) -> dict[str, Any]:
    """The inspect Job of the pvc:// adapter named ``adapter``: the same Job as a model's (claim read-only at
    :data:`MOUNT`, no token, UID 65534, the pods' nodes, TTL), running :data:`ADAPTER_SCRIPT` on its folder."""
    return _job(owner, spec, source, claim_uid, image, name=adapter_job_name(owner, source, claim_uid),
                command=["/bin/sh", "-c", ADAPTER_SCRIPT, "inspect-adapter"], args=[folder(source)],
                extra_annotations={ADAPTER_LABEL: adapter})


def _job(owner: Owner, spec: LLMDeploymentSpec, source: PVCSource, claim_uid: str, image: str, *, name: str,
         command: list[str], args: list[str], extra_annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container = {
        "name": CONTAINER, "image": image, "command": command,
        "args": args,
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT, "readOnly": True}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}}],
    }
    if spec.gpu.node_selector:
        pod["nodeSelector"] = dict(spec.gpu.node_selector)
    if spec.gpu.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.gpu.tolerations]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": owner.namespace,
                         "labels": labels(owner),
                         "annotations": {f"{GROUP}/source": source.uri, f"{GROUP}/claim-uid": claim_uid,
                                         **(extra_annotations or {})},
                         "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                                              "name": owner.name, "uid": owner.uid, "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": TTL_SECONDS,
                     "activeDeadlineSeconds": DEADLINE_SECONDS,
                     "template": {"metadata": {"labels": labels(owner)}, "spec": pod}}}
