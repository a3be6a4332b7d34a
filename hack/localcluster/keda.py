"""KEDA in the local cluster: its operator and its metrics API server as processes on loopback.

KEDA's operator watches ScaledObjects, keeps an HPA per ScaledObject and serves the trigger values over gRPC
(mutual TLS); the metrics API server (KEDA's "adapter", an aggregated API server) answers the HPA's
``external.metrics.k8s.io`` queries from them. Here:

* both are built from ``github.com/kedacore/keda/v2`` (``hack/tools/keda``) and run as plain processes with the
  admin kubeconfig, watching every namespace;
* one certificate from the cluster CA (``pki/keda.crt``, server and client) serves the gRPC link both ways and the
  metrics API server's HTTPS port; the cert dir both read holds it as ``tls.crt``/``tls.key`` with ``ca.crt``;
* the API server reaches the metrics API server through an APIService for ``v1beta1.external.metrics.k8s.io``
  whose Service is an ExternalName ``localhost``: the aggregator dials an ExternalName's host as is (a Service
  with a ClusterIP would need kube-proxy, and an Endpoints object may not name a loopback address); it
  authenticates with the front-proxy client certificate the API server already has;
* KEDA's CRDs come from the same module, copied next to the binary when it is built, and are applied before the
  operator starts.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

from .api import Api, http_ok
from .binaries import BINARIES, KEDA_MODULE, KEDA_VERSION, go_env
from .paths import ClusterError
from .pki import make_cert
from .state import Cluster

NAMESPACE = "keda"
METRICS_SERVICE = "keda-metrics-apiserver"
APISERVICE = "v1beta1.external.metrics.k8s.io"
CERT = "keda"


def crds_dir() -> Path:
    return BINARIES["keda-operator"].path.parent / "crds"


def cert_dir(c: Cluster) -> Path:
    return c.pki / "keda"


def ensure_crds() -> Path:
    """KEDA's CRDs of the pinned version (config/crd/bases in its module), cached beside the binary."""
    target = crds_dir()
    if target.is_dir() and any(target.glob("*.yaml")):
        return target
    out = subprocess.run(["go", "mod", "download", "-json", f"{KEDA_MODULE}@{KEDA_VERSION}"], env=go_env(False),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ClusterError(f"keda: cannot read {KEDA_MODULE}@{KEDA_VERSION} for its CRDs: {out.stderr.strip()}")
    source = Path(json.loads(out.stdout)["Dir"]) / "config" / "crd" / "bases"
    tmp = target.with_name(".crds-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for crd in sorted(source.glob("*.yaml")):
        shutil.copyfile(crd, tmp / crd.name)
    tmp.replace(target)
    return target


def ensure_certs(c: Cluster) -> Path:
    """tls.crt/tls.key (server and client, cluster CA) and ca.crt, where both KEDA processes read them."""
    folder = cert_dir(c)
    if (folder / "tls.crt").exists():
        return folder
    sans = ("IP:127.0.0.1", "DNS:localhost", f"DNS:{METRICS_SERVICE}.{NAMESPACE}.svc",
            f"DNS:keda-operator.{NAMESPACE}.svc")
    make_cert(c.pki, CERT, "/CN=keda", client=True, server_sans=sans)
    folder.mkdir(exist_ok=True)
    shutil.copyfile(c.pki / "ca.crt", folder / "ca.crt")
    shutil.copyfile(c.pki / f"{CERT}.key", folder / "tls.key")
    (folder / "tls.key").chmod(0o600)
    shutil.copyfile(c.pki / f"{CERT}.crt", folder / "tls.crt")
    return folder


def _kubectl(c: Cluster, *args: str) -> None:
    out = subprocess.run([str(BINARIES["kubectl"].path), f"--kubeconfig={c.kubeconfig}", *args],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")


def _ensure_namespace(api: Api) -> None:
    code, body = api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NAMESPACE}})
    if code not in (201, 409):
        raise ClusterError(f"keda: creating namespace {NAMESPACE}: {code} {body}")


def prepare_operator(c: Cluster) -> None:
    """CRDs applied, namespace and certificates in place before the operator starts."""
    _kubectl(c, "apply", "--server-side", "--force-conflicts", "-f", str(ensure_crds()))
    _ensure_namespace(Api(c))
    ensure_certs(c)


def _put(api: Api, path: str, obj: dict[str, object]) -> None:
    """Create or replace ``obj`` at ``path`` (the collection) / its name."""
    name = obj["metadata"]["name"]  # type: ignore[index]
    code, live = api.request("GET", f"{path}/{name}")
    if code == 200:
        obj["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]  # type: ignore[index]
        code, body = api.request("PUT", f"{path}/{name}", obj)
    else:
        code, body = api.request("POST", path, obj)
    if code not in (200, 201):
        raise ClusterError(f"keda: writing {path}/{name}: {code} {body}")


def register_metrics_api(c: Cluster) -> None:
    """The ExternalName Service and the APIService that send external.metrics.k8s.io to the metrics API server."""
    api = Api(c)
    _ensure_namespace(api)
    ensure_certs(c)
    port = c.ports["keda-adapter"]
    _put(api, f"/api/v1/namespaces/{NAMESPACE}/services", {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}]},
    })
    _put(api, "/apis/apiregistration.k8s.io/v1/apiservices", {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "caBundle": base64.b64encode((c.pki / "ca.crt").read_bytes()).decode(),
                 "service": {"namespace": NAMESPACE, "name": METRICS_SERVICE, "port": port}},
    })


def process_env(c: Cluster) -> dict[str, str]:
    return {"KUBECONFIG": str(c.kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": NAMESPACE,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE, "KEDA_HTTP_DEFAULT_TIMEOUT": "3000"}


def operator_args(c: Cluster) -> list[str]:
    return [
        f"--metrics-bind-address=127.0.0.1:{c.ports['keda-operator-metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{c.ports['keda-operator-probe']}",
        f"--metrics-service-bind-address=127.0.0.1:{c.ports['keda-metrics-service']}",
        f"--cert-dir={cert_dir(c)}",
        "--enable-cert-rotation=false",  # the certificates above, from the cluster CA
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        "--leader-elect=false",
        f"--ca-dir={cert_dir(c)}",
        "--zap-log-level=info",
    ]


def adapter_args(c: Cluster) -> list[str]:
    folder = cert_dir(c)
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={c.ports['keda-adapter']}",
        f"--cert-dir={folder}",  # the gRPC client's mTLS material (ca.crt, tls.crt, tls.key) is read from here
        f"--tls-cert-file={folder / 'tls.crt'}",
        f"--tls-private-key-file={folder / 'tls.key'}",
        f"--authentication-kubeconfig={c.kubeconfig}",
        f"--authorization-kubeconfig={c.kubeconfig}",
        f"--lister-kubeconfig={c.kubeconfig}",
        f"--metrics-service-address=127.0.0.1:{c.ports['keda-metrics-service']}",
        f"--port={c.ports['keda-adapter-metrics']}",  # its own /metrics (KEDA binds every interface here)
        "--v=0",
    ]


def operator_healthy(c: Cluster) -> bool:
    return http_ok(f"http://127.0.0.1:{c.ports['keda-operator-probe']}/healthz")


def adapter_healthy(c: Cluster) -> bool:
    """Its own /healthz, and the API server serving external.metrics.k8s.io through it (the APIService is
    Available once the aggregator could reach it)."""
    if not http_ok(f"https://127.0.0.1:{c.ports['keda-adapter']}/healthz"):
        return False
    try:
        code, body = Api(c).request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}", timeout=3.0)
    except OSError:
        return False
    conditions = (body or {}).get("status", {}).get("conditions", []) if code == 200 else []
    return any(x.get("type") == "Available" and x.get("status") == "True" for x in conditions)
