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
from llm_autopilot.render.kubernetes import Owner

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
            "app.kubernetes.io/instance": owner.name, INSPECT_LABEL: owner.name}


def job(owner: Owner, spec: LLMDeploymentSpec, source: PVCSource, claim_uid: str, image: str) -> dict[str, Any]:
    container = {
        "name": CONTAINER, "image": image, "command": ["llm-autopilot"],
        "args": ["inspect-volume", folder(source)],
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
            "metadata": {"name": job_name(owner, source, claim_uid), "namespace": owner.namespace,
                         "labels": labels(owner),
                         "annotations": {f"{GROUP}/source": source.uri, f"{GROUP}/claim-uid": claim_uid},
                         "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                                              "name": owner.name, "uid": owner.uid, "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": TTL_SECONDS,
                     "activeDeadlineSeconds": DEADLINE_SECONDS,
                     "template": {"metadata": {"labels": labels(owner)}, "spec": pod}}}
