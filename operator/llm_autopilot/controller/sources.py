"""Resolve the spec's model from where its files are: the Hub, an S3 prefix, or a volume (what its inspect Job read).

The Hub and S3 are read only when the catalog and the inline override do not describe the model; the S3
credentials Secret is read only then, too. An S3 reading is kept in status.source with each object's ETag and
size: later reconciles HEAD the objects and GET them again only when one changed.
"""

from __future__ import annotations

from collections.abc import Callable

from llm_autopilot.api import convert
from llm_autopilot.api.sources import HubSource, PVCSource, S3Source
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, S3Options, SourceObject, SourceStatus
from llm_autopilot.catalog.hf_config import planner_view
from llm_autopilot.domain.architecture import ModelArchitecture
from llm_autopilot.hub.client import ModelFiles
from llm_autopilot.hub.resolve import (
    ArchitectureRequired,
    ModelReader,
    pvc_needs_architecture,
    resolve_model,
    resolve_offline,
)
from llm_autopilot.storage.egress_http import CheckedTransport
from llm_autopilot.storage.s3 import S3Client, default_endpoint, model_objects, read_model_files
from llm_autopilot.storage.sigv4 import Credentials

#: (secret name, key, what it is for) -> the value; raises when the Secret cannot be read
SecretReader = Callable[[str, str, str], str]


def s3_credentials(options: S3Options | None, secret: SecretReader) -> Credentials | None:
    ref = options.credentials_secret_ref if options else None
    if ref is None:
        return None
    return Credentials(secret(ref.name, ref.access_key_id_key, "the S3 access key id"),
                       secret(ref.name, ref.secret_access_key_key, "the S3 secret access key"))


def s3_client(options: S3Options | None, secret: SecretReader, *, timeout: float,
              field: str = "spec.model.s3") -> S3Client:
    """A client for the store ``options`` describe (``field``: where the spec says so, for the messages)."""
    region = options.region if options else "us-east-1"
    # the operator's own connection: only to what the egress policy allows, and to the address it checked
    return S3Client(s3_endpoint(options), region, s3_credentials(options, secret), timeout=timeout, field=field,
                    transport=CheckedTransport(field=f"{field}.endpoint"))


class S3ModelReader:
    """Reads the model files under an s3:// prefix; the client (and its Secret) only when called.

    ``recorded``: what a previous reconcile read (status.source). When the HEADs of the same objects at the
    same endpoint show the same ETags and sizes, it is the answer and nothing is GET; else the files are read
    again. ``status`` is what to keep in status.source after :meth:`fetch`."""

    def __init__(self, source: S3Source, client: Callable[[], S3Client], *, endpoint: str = "",
                 recorded: SourceStatus | None = None) -> None:
        self._source = source
        self._client = client
        self._endpoint = endpoint
        self._recorded = recorded
        self.status: SourceStatus | None = None

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles:
        with self._client() as client:
            objects = model_objects(client, self._source)
            seen = [SourceObject(key=o.key, etag=o.etag, size=o.size) for o in objects]
            kept = self._recorded
            if (kept is not None and kept.state == "Inspected" and kept.config is not None and kept.claim_uid is None
                    and all(o.etag for o in seen)  # a store without ETags: the size alone proves nothing
                    and (kept.uri, kept.endpoint, kept.objects) == (self._source.uri, self._endpoint, seen)):
                self.status = kept
                return ModelFiles(dict(kept.config), kept.checkpoint_bytes)
            files = read_model_files(client, self._source, objects)
        view = ModelFiles(planner_view(files.config), files.checkpoint_bytes)  # as a kept reading gives it
        self.status = SourceStatus(uri=self._source.uri, endpoint=self._endpoint, objects=seen, state="Inspected",
                                   config=view.config, checkpoint_bytes=view.checkpoint_bytes)
        return view


class VolumeFiles:
    """What a pvc:// source's inspect Job read on the volume (controller/inspect_step.py)."""

    def __init__(self, files: ModelFiles) -> None:
        self._files = files

    def fetch(self, repo_id: str, revision: str | None = None) -> ModelFiles:
        return self._files


def s3_endpoint(options: S3Options | None) -> str:
    return (options.endpoint if options else None) or default_endpoint(options.region if options else "us-east-1")


def resolve_spec_source(spec: LLMDeploymentSpec, *, hub: ModelReader, secret: SecretReader, timeout: float,
                        volume: ModelFiles | None = None, recorded: SourceStatus | None = None,
                        ) -> tuple[ModelArchitecture, SourceStatus | None]:
    """The architecture of the spec's model, read from its source (``volume``: what a pvc:// source's inspect
    Job read there), and for an s3:// source read from the store, what to keep in status.source (``recorded``:
    what was kept; unchanged objects are not read again)."""
    model = spec.model
    override = model.architecture.as_hf_config() if model.architecture else None
    weight_bytes = model.architecture.weight_bytes if model.architecture else None
    where = model.location
    if isinstance(where, HubSource):
        return resolve_model(where.repo, revision=model.revision, override=override,
                             override_checkpoint_bytes=weight_bytes, variants=convert.variants(spec),
                             client=hub), None
    if isinstance(where, PVCSource):
        found = resolve_offline(model.name, override=override, override_checkpoint_bytes=weight_bytes)
        if found is None and volume is not None:
            return resolve_model(f"{model.name}", override=override, override_checkpoint_bytes=weight_bytes,
                                 client=VolumeFiles(volume), use_catalog=False), None
        if found is None:
            raise ArchitectureRequired(pvc_needs_architecture(model.name, where.uri, override))
        return found, None
    reader = S3ModelReader(where, lambda: s3_client(model.s3, secret, timeout=timeout),
                           endpoint=s3_endpoint(model.s3), recorded=recorded)
    return resolve_model(model.name, override=override, override_checkpoint_bytes=weight_bytes, client=reader,
                         use_catalog=False), reader.status
