"""The model cache (spec.model.cache): a PVC, the Job that fills it, and how the vLLM pods load it. Pure.

One PVC per (namespace, source, revision), named by a hash of the three, so every LLMDeployment and every
remediation step of that model and revision shares it: a step changes vLLM's flags, never the weights. The PVC
and its Job carry no owner: the cache outlives any one LLMDeployment (as NIM's NIMCache does) and is removed
with ``kubectl delete pvc,job -l llm-autopilot.io/cache=<name>``.

The Job runs ``llm-autopilot fetch`` in the operator's image, with no ServiceAccount token; the vLLM pods mount
the PVC read-only and start only on a complete folder: an init container checks the completion marker that
fetch writes last, after every size and hash check.

Inside the PVC the model is in a folder of its own. The operator's PVC holds one (source, revision) by its name,
so the folder is ``model``. A claim the user gives (``existingClaim``) may be shared by LLMDeployments of different
models, so each (source, revision) gets ``models/<slug>-<hash>`` there (:func:`model_folder`), with a download Job
of its own: two models on one claim never load each other's weights (issue #28).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from llm_autopilot.api import GROUP
from llm_autopilot.api.sources import HubSource, S3Source
from llm_autopilot.api.v1alpha1 import CacheStatus, LLMDeploymentSpec, ModelCache, S3Options

CACHE_LABEL = f"{GROUP}/cache"
CACHE_MOUNT = "/model-cache"
#: where fetch fills the model inside the operator's own PVC (a folder, so the PVC's lost+found is not in the way)
CACHE_FOLDER = "model"
#: the folder of an existing claim's models: one subfolder per (source, revision), see :func:`model_folder`
SHARED_FOLDER = "models"
MARKER = ".llm-autopilot-complete"  # storage/fetch.py writes it (a shell module: the name is repeated there)
VOLUME = "model-cache"
#: the cache's headroom over the checkpoint: 10 % and 1 GiB (filesystem overhead, tokenizer and config files)
SIZE_MARGIN = 0.10
SIZE_EXTRA_BYTES = 2**30
FETCH_BACKOFF_LIMIT = 6
_SLUG = re.compile(r"[^a-z0-9]+")


def cache_key(namespace: str, source: str, revision: str | None) -> str:
    return hashlib.sha256(f"{namespace}\0{source}\0{revision or 'main'}".encode()).hexdigest()[:12]


def claim_name(spec: LLMDeploymentSpec, namespace: str) -> str:
    """The cache PVC: the existing claim, else ``llm-cache-<model>-<hash>`` (at most 63 characters)."""
    cache = spec.model.cache
    if cache is not None and cache.existing_claim:
        return cache.existing_claim
    where = spec.model.location
    slug = _SLUG.sub("-", where.uri.split("://", 1)[1].lower()).strip("-")[:32].strip("-")
    return f"llm-cache-{slug}-{cache_key(namespace, where.uri, spec.model.revision)}"


def _s3_endpoint(spec: LLMDeploymentSpec) -> str:
    where, options = spec.model.location, spec.model.s3
    return (options.endpoint or "") if isinstance(where, S3Source) and options is not None else ""


def shared_folder(source: str, revision: str | None, s3_endpoint: str = "") -> str:
    """A model's folder in a shared claim: ``models/<slug>-<hash>``, the slug readable (the source, path-safe),
    the hash of the source, the revision (none is ``main``, as the Hub reads it) and an s3:// source's endpoint
    (the same bucket and prefix on two stores are two models). Pure and stable: the same model is the same
    folder in every LLMDeployment, any other model or revision another one."""
    slug = _SLUG.sub("-", source.split("://", 1)[-1].lower()).strip("-")[:40].strip("-") or "model"
    key = hashlib.sha256(f"{source}\0{revision or 'main'}\0{s3_endpoint}".encode()).hexdigest()[:12]
    return f"{SHARED_FOLDER}/{slug}-{key}"


def model_folder(spec: LLMDeploymentSpec) -> str:
    """The model's folder in the cache PVC: ``model`` in the operator's PVC (one per source and revision by its
    name), the model's own folder in an existing claim (which other models may share)."""
    cache = spec.model.cache
    if cache is not None and cache.existing_claim:
        return shared_folder(spec.model.location.uri, spec.model.revision, _s3_endpoint(spec))
    return CACHE_FOLDER


def fetch_job_name(spec: LLMDeploymentSpec, claim: str) -> str:
    """The model's download Job: ``<claim>-fetch`` for the operator's PVC; in an existing claim one Job per
    folder (``<claim>-fetch-<hash>``), so a second model's Job is never taken for the first one's."""
    if model_folder(spec) == CACHE_FOLDER:
        return f"{claim}-fetch"[:63].rstrip("-")
    digest = hashlib.sha256(f"{claim}\0{model_folder(spec)}".encode()).hexdigest()[:12]
    return f"{claim[:44].rstrip('-.')}-fetch-{digest}"


def enabled(spec: LLMDeploymentSpec) -> bool:
    cache = spec.model.cache
    return cache is not None and cache.enabled


def size_bytes(cache: ModelCache, checkpoint_bytes: int) -> int | str:
    """The PVC's request: the spec's size, else the checkpoint plus the margin, in whole GiB."""
    if cache.size is not None:
        return cache.size
    return math.ceil((checkpoint_bytes * (1 + SIZE_MARGIN) + SIZE_EXTRA_BYTES) / 2**30) * 2**30


@dataclass(frozen=True)
class CacheInputs:
    spec: LLMDeploymentSpec
    namespace: str
    #: the operator's own image (the Job runs ``llm-autopilot fetch``)
    image: str
    checkpoint_bytes: int
    #: a Hub mirror for the Job (the operator's HF_ENDPOINT)
    hub_endpoint: str | None = None

    @property
    def claim(self) -> str:
        return claim_name(self.spec, self.namespace)

    @property
    def cache(self) -> ModelCache:
        assert self.spec.model.cache is not None
        return self.spec.model.cache


def _labels(claim: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "llm-autopilot", "app.kubernetes.io/component": "model-cache",
            CACHE_LABEL: claim}


def pvc(inputs: CacheInputs) -> dict[str, Any] | None:
    """The cache PVC, or None for an existing claim (the user's)."""
    if inputs.cache.existing_claim:
        return None
    spec: dict[str, Any] = {"accessModes": [inputs.cache.access_mode],
                            "resources": {"requests": {"storage": size_bytes(inputs.cache, inputs.checkpoint_bytes)}}}
    if inputs.cache.storage_class_name:
        spec["storageClassName"] = inputs.cache.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": inputs.claim, "namespace": inputs.namespace, "labels": _labels(inputs.claim),
                         "annotations": {f"{GROUP}/source": inputs.spec.model.location.uri}},
            "spec": spec}


def s3_env(options: S3Options | None) -> list[dict[str, Any]]:
    """The S3 keys from the referenced Secret, for ``llm-autopilot fetch`` (none for a public bucket)."""
    if options is None or options.credentials_secret_ref is None:
        return []
    ref = options.credentials_secret_ref
    return [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": ref.name,
                                                                         "key": ref.access_key_id_key}}},
            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
                "name": ref.name, "key": ref.secret_access_key_key}}}]


def s3_args(options: S3Options | None) -> list[str]:
    if options is None:
        return []
    return [*(["--s3-endpoint", options.endpoint] if options.endpoint else []), "--s3-region", options.region]


def _fetch_env(spec: LLMDeploymentSpec) -> list[dict[str, Any]]:
    model = spec.model
    if isinstance(model.location, S3Source):
        return s3_env(model.s3)
    if isinstance(model.location, HubSource) and model.hub_token_secret_ref:
        ref_ = model.hub_token_secret_ref
        return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref_.name, "key": ref_.key}}}]
    return []


def fetch_args(spec: LLMDeploymentSpec) -> list[str]:
    model = spec.model
    args = ["fetch", "--source", model.location.uri, "--dest", model_path(spec)]
    if model.revision:
        args += ["--revision", model.revision]
    if isinstance(model.location, S3Source):
        args += s3_args(model.s3)
    return args


def job(inputs: CacheInputs) -> dict[str, Any]:
    """The download Job: resumes on a retry (the partial files are on the PVC), checks, marks complete."""
    env = _fetch_env(inputs.spec) + ([{"name": "HF_ENDPOINT", "value": inputs.hub_endpoint}]
                                     if inputs.hub_endpoint and inputs.spec.model.hub_repo else [])
    folder = model_folder(inputs.spec)
    # in a shared claim the Job says which model and folder it fills (the operator's own PVC says it already)
    shared = ({f"{GROUP}/source": inputs.spec.model.location.uri, f"{GROUP}/folder": folder}
              if folder != CACHE_FOLDER else None)
    return fetch_job(inputs, fetch_job_name(inputs.spec, inputs.claim), fetch_args(inputs.spec), env,
                     annotations=shared)


def fetch_job(inputs: CacheInputs, name: str, args: list[str], env: list[dict[str, Any]],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job that runs ``llm-autopilot fetch`` into the cache PVC (the model's, or an s3:// LoRA adapter's)."""
    claim = inputs.claim
    container = {
        "name": "fetch", "image": inputs.image, "command": ["llm-autopilot"], "args": args, "env": env,
        "volumeMounts": [{"name": VOLUME, "mountPath": CACHE_MOUNT}],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: dict[str, Any] = {
        "restartPolicy": "OnFailure", "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}]}
    # on the GPU pool's nodes, as the vLLM pods: they reach the store, tolerate the pool's taints, and a
    # ReadWriteOnce cache is written where it is read
    gpu = inputs.spec.gpu
    if gpu.node_selector:
        pod["nodeSelector"] = dict(gpu.node_selector)
    if gpu.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in gpu.tolerations]
    metadata: dict[str, Any] = {"name": name, "namespace": inputs.namespace, "labels": _labels(claim)}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
            "spec": {"backoffLimit": FETCH_BACKOFF_LIMIT, "template": {"metadata": {"labels": _labels(claim)},
                                                                       "spec": pod}}}


def model_path(spec: LLMDeploymentSpec) -> str:
    """The folder vLLM loads from the cache (and fetch fills)."""
    return f"{CACHE_MOUNT}/{model_folder(spec)}"


def pod_volume(claim: str) -> dict[str, Any]:
    return {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}


def pod_mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True}


def marker_check(image: str, spec: LLMDeploymentSpec) -> dict[str, Any]:
    """An init container in the vLLM image: the pod goes no further than this on a partial cache."""
    marker = f"{model_path(spec)}/{MARKER}"
    return {"name": "cache-complete", "image": image, "command": ["/bin/sh", "-c",
            f"test -f {marker} || {{ echo 'the model cache is not complete ({marker} is missing)' >&2; exit 1; }}"],
            "volumeMounts": [pod_mount()],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}


# --- the download's progress, read from the Job and its pod --------------------------------------------


def _last_json(text: str, kind: str) -> dict[str, Any] | None:
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if line.startswith("{") and f'"fetch": "{kind}"' in line:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def has_summary(text: str) -> bool:
    """Whether a termination message or log holds fetch's completion summary."""
    return _last_json(text, "complete") is not None


def cache_status(claim: str, job_obj: dict[str, Any] | None, log_tail: str = "",
                 termination_message: str = "", *, earlier_try: str = "") -> CacheStatus:
    """What the Job and its pod say: Complete (the Job succeeded), Failed (out of retries), Downloading (its
    latest progress line), else Pending. ``earlier_try`` is the message of the pod's previous, failed try: a
    download that completed on a retry keeps saying why it was retried (the window in which the retrying Job
    shows it can be shorter than a resync)."""
    status = (job_obj or {}).get("status") or {}
    done = _last_json(termination_message, "complete") or _last_json(log_tail, "complete")
    if int(status.get("succeeded") or 0) > 0:
        total = int((done or {}).get("bytes") or 0) or None
        retried = _error_line(earlier_try)
        return CacheStatus(claim_name=claim, state="Complete", bytes=total or 0, total_bytes=total, percent=100.0,
                           message=f"completed on a retry; the failed try said: {retried}"[:500] if retried else "")
    failed = any(c.get("type") == "Failed" and c.get("status") == "True" for c in status.get("conditions") or [])
    progress = _last_json(log_tail, "progress")
    seen = int((progress or {}).get("bytes") or 0)
    total = int((progress or {}).get("total") or 0) or None
    percent = round(min(100.0, 100 * seen / total), 1) if total else None
    if failed:
        reason = next((c.get("message", "") for c in status.get("conditions") or [] if c.get("type") == "Failed"), "")
        error = _error_line(log_tail) or _error_line(termination_message)
        return CacheStatus(claim_name=claim, state="Failed", bytes=seen, total_bytes=total, percent=percent,
                           message=(error or reason)[:500])
    state = "Downloading" if progress is not None or int(status.get("active") or 0) else "Pending"
    # a try that failed while the Job still retries: say why now, not after the last retry
    last_error = _error_line(termination_message)
    message = (f"the last try failed and the Job retries (at most {FETCH_BACKOFF_LIMIT} times): {last_error}"[:500]
               if last_error else "")
    return CacheStatus(claim_name=claim, state=state, bytes=seen, total_bytes=total, percent=percent,
                       message=message)


def _error_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines())
                 if line.startswith(("error:", "internal error:"))), "")
