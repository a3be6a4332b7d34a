"""Admission's access check: may the requesting user read the Secrets an LLMDeployment hands to its pods?

Whoever creates an LLMDeployment chooses the image and the environment of pods the operator creates, so a
Secret named in the spec ends up readable by that user's code (a confused deputy: the operator, not the user,
would be the one allowed to read it). The webhook therefore asks the API server, with a SubjectAccessReview in
the requesting user's name, whether that user may ``get`` each referenced Secret, and refuses otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec

#: SubjectAccessReviews answer in milliseconds; the API server gives the whole webhook 10 s by default
_REVIEW_TIMEOUT_SECONDS = 5


def referenced_secrets(spec: LLMDeploymentSpec) -> list[str]:
    """Names of the Secrets the pods would read: the Hub token, the S3 credentials (the model's, the LoRA
    adapters') and every ``env[].valueFrom.secretKeyRef``."""
    names = set()
    if spec.model.hub_token_secret_ref is not None:
        names.add(spec.model.hub_token_secret_ref.name)
    # the download Jobs' pods read them: the model's, and each s3:// LoRA adapter's
    for s3 in (spec.model.s3, spec.lora.s3 if spec.lora else None):
        if s3 is not None and s3.credentials_secret_ref is not None:
            names.add(s3.credentials_secret_ref.name)
    for var in spec.vllm.env:
        if var.value_from is not None and var.value_from.secret_key_ref is not None:
            names.add(var.value_from.secret_key_ref.name)
    return sorted(names)


def _who(userinfo: Mapping[str, Any]) -> str:
    return str(userinfo.get("username") or "the requesting user")


def unreadable_secrets_message(authorization: client.AuthorizationV1Api, userinfo: Mapping[str, Any],
                               namespace: str, names: list[str]) -> str | None:
    """None when the user may get every named Secret in the namespace; else the one-line refusal.

    Fails closed: when the API server cannot answer, the LLMDeployment is refused with the reason.
    """
    denied = []
    for name in names:
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=userinfo.get("username"), uid=userinfo.get("uid"), groups=userinfo.get("groups"),
            extra=userinfo.get("extra"),
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb="get", group="", resource="secrets", name=name)))
        try:
            answer = authorization.create_subject_access_review(review, _request_timeout=_REVIEW_TIMEOUT_SECONDS)
        except ApiException as exc:
            return (f"cannot check whether {_who(userinfo)} may read Secret {name!r}: the API server answered "
                    f"{exc.status} {exc.reason} (the operator needs create on "
                    "subjectaccessreviews.authorization.k8s.io)")
        if not (answer.status and answer.status.allowed):
            denied.append(name)
    if not denied:
        return None
    listed = ("Secret " if len(denied) == 1 else "Secrets ") + ", ".join(repr(n) for n in denied)
    return (f"{_who(userinfo)} may not get {listed} in namespace {namespace!r}, which this LLMDeployment "
            "would hand to its pods (spec.model.hubTokenSecretRef, spec.model.s3.credentialsSecretRef, "
            "spec.lora.s3.credentialsSecretRef, "
            "spec.vllm.env[].valueFrom.secretKeyRef): ask "
            "for get on that Secret, or reference one you can read")
