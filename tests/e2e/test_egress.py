"""The operator's own S3 client goes only where its egress policy allows (issue #28 item 1), on the local cluster.

- An endpoint the webhook can judge (the metadata service in any spelling, for the model and for LoRA adapters)
  is refused at apply.
- A name that resolves to a refused address (``localhost``: loopback, not in the e2e operator's allowlist, which
  names only the local S3 store's gateway) is never contacted: a listener there sees no request, and a condition
  names the field and the allowlist. No real vLLM is needed: the operator reads the model's config before any pod.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Kubectl, Operator, wait_for

pytestmark = pytest.mark.e2e

GPU = {"product": "nvidia-l4", "maxGPUs": 1, "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]}


def llmd(name: str, model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "llm-autopilot.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": name},
            "spec": {"model": model, "gpu": GPU, **spec}}


def s3_model(endpoint: str) -> dict[str, Any]:
    # not in the catalog and no architecture given: the operator must read config.json from the store
    return {"name": "acme/unlisted-7b", "source": "s3://models/acme-unlisted-7b", "s3": {"endpoint": endpoint},
            "cache": {"enabled": True}}


@pytest.mark.parametrize("endpoint", ["http://169.254.169.254", "http://2852039166", "http://[::ffff:a9fe:a9fe]",
                                      "http://0251.0376.0251.0376:80", "http://[fd00:ec2::254]"])
def test_an_endpoint_the_webhook_can_judge_is_refused_at_apply(kubectl: Kubectl, operator: Operator,
                                                               namespace: str, endpoint: str) -> None:
    result = kubectl("apply", "-n", namespace, "-f", "-", check=False,
                     input=yaml.safe_dump(llmd("metadata", s3_model(endpoint))))
    assert result.returncode != 0, f"{endpoint} was admitted"
    assert "never connects there" in result.stderr or "spelled another way" in result.stderr, result.stderr


def test_a_lora_s3_endpoint_at_the_metadata_service_is_refused_at_apply(kubectl: Kubectl, operator: Operator,
                                                                       namespace: str) -> None:
    lora = {"adapters": [{"name": "a", "source": "s3://adapters/a"}], "s3": {"endpoint": "http://[::ffff:a9fe:a9fe]"}}
    body = llmd("lora", {"name": "Qwen/Qwen3-8B", "cache": {"enabled": True}}, lora=lora)
    result = kubectl("apply", "-n", namespace, "-f", "-", check=False, input=yaml.safe_dump(body))
    assert result.returncode != 0 and "never connects there" in result.stderr, result.stderr


class Listener:
    """An HTTP server on loopback that records every request and answers 404 (as a store without the object)."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append(f"{self.command} {self.path}")
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._answer()

            def do_HEAD(self) -> None:
                self._answer()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.close()


def test_a_name_that_resolves_to_loopback_is_not_contacted(kubectl: Kubectl, operator: Operator, namespace: str,
                                                           listener: Listener) -> None:
    kubectl("apply", "-n", namespace, "-f", "-",
            input=yaml.safe_dump(llmd("loopback", s3_model(f"http://localhost:{listener.port}"))))

    def refused() -> dict[str, Any] | None:
        obj = kubectl.maybe("llmd", "loopback", "-n", namespace) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or []
                     if "egress.allow" in c.get("message", "")), None)

    found = wait_for("a condition that names the egress allowlist", refused, timeout=90)
    assert "spec.model.s3.endpoint" in found["message"] and "loopback" in found["message"], found
    assert listener.requests == [], f"the operator contacted the endpoint: {listener.requests}"


def test_the_store_the_allowlist_names_is_reached(kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    """The local S3 store is on the pod bridge's gateway, a private address the e2e operator's allowlist names
    (hack/localcluster/s3.py): the operator reaches it, and says what the store answered (no credentials were
    given: access denied, or no such bucket)."""
    endpoint = kubectl.env["LLM_AUTOPILOT_S3_ENDPOINT"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(llmd("allowed", s3_model(endpoint))))

    def answered() -> dict[str, Any] | None:
        obj = kubectl.maybe("llmd", "allowed", "-n", namespace) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or []
                     if "s3://models" in c.get("message", "")), None)

    found = wait_for("a condition with the store's answer", answered, timeout=90)
    assert "egress.allow" not in found["message"], found


@pytest.mark.parametrize("endpoint", ["http://10.99.0.5:8333", "http://127.0.0.1:8333"])
def test_a_literal_address_the_allowlist_does_not_name_is_refused_at_apply(
        kubectl: Kubectl, operator: Operator, namespace: str, endpoint: str) -> None:
    result = kubectl("apply", "-n", namespace, "-f", "-", check=False,
                     input=yaml.safe_dump(llmd("private", s3_model(endpoint))))
    assert result.returncode != 0 and "egress.allow" in result.stderr, result.stderr
