"""Certificates and kubeconfigs of the local cluster (the ``openssl`` CLI): CAs, serving and client certificates."""

from __future__ import annotations

import base64
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .paths import ClusterError, log
from .state import SERVICE_IP


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_key(path: Path, rsa: bool = False) -> None:
    alg = (
        ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
        if rsa
        else ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    )
    openssl("genpkey", *alg, "-out", str(path), cwd=path.parent)
    path.chmod(0o600)


def make_ca(pki: Path, name: str, common_name: str) -> None:
    """Self-signed CA `<name>.crt`/`<name>.key` in `pki`."""
    make_key(pki / f"{name}.key")
    args = f"req -x509 -new -key {name}.key -subj /CN={common_name} -days 3650 -sha256 -out {name}.crt"
    openssl(
        *args.split(),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=pki,
    )


def make_cert(
    pki: Path,
    name: str,
    subject: str,
    *,
    ca: str = "ca",
    client: bool = False,
    server_sans: Sequence[str] = (),
) -> None:
    """Key `<name>.key` + certificate `<name>.crt` signed by CA `<ca>` in `pki`."""
    make_key(pki / f"{name}.key")
    usages = ["serverAuth"] if server_sans else []
    usages += ["clientAuth"] if client else []
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if server_sans:
        ext.append("subjectAltName=" + ",".join(server_sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    serial = secrets.randbits(63)
    args = (
        f"x509 -req -in {name}.csr -CA {ca}.crt -CAkey {ca}.key -set_serial {serial}"
        f" -days 3650 -sha256 -extfile {name}.ext -out {name}.crt"
    )
    openssl(*args.split(), cwd=pki)
    (pki / f"{name}.csr").unlink()
    (pki / f"{name}.ext").unlink()


SERVING_SANS = (
    "IP:127.0.0.1",
    f"IP:{SERVICE_IP}",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)

# kubeconfig name -> (certificate name, subject)
CLIENT_IDENTITIES: dict[str, tuple[str, str]] = {
    "admin": ("admin", "/O=system:masters/CN=llm-autopilot-admin"),
    "controller-manager": ("controller-manager", "/CN=system:kube-controller-manager"),
    "scheduler": ("scheduler", "/CN=system:kube-scheduler"),
}


def ensure_pki(pki: Path) -> None:
    if (pki / "done").exists():
        return
    if shutil.which("openssl") is None:
        raise ClusterError("`openssl` is not on PATH (apt-get install openssl)")
    log(f"generating CA and certificates in {pki}")
    if pki.exists():
        shutil.rmtree(pki)
    pki.mkdir(parents=True)
    pki.chmod(0o700)
    make_ca(pki, "ca", "llm-autopilot-ca")
    # Separate CA for the aggregation layer's request-header authentication;
    # without it every delegating component logs "missing content for CA bundle".
    make_ca(pki, "front-proxy-ca", "llm-autopilot-front-proxy-ca")
    make_cert(pki, "front-proxy-client", "/CN=front-proxy-client", ca="front-proxy-ca", client=True)
    make_cert(pki, "apiserver", "/CN=kube-apiserver", server_sans=SERVING_SANS)
    make_cert(pki, "kwok", "/CN=kwok", server_sans=("IP:127.0.0.1", "DNS:localhost"))
    for cert, subject in CLIENT_IDENTITIES.values():
        make_cert(pki, cert, subject, client=True)
    make_key(pki / "sa.key", rsa=True)  # ServiceAccount token signing (RS256)
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "done").write_text("ok\n")


def b64file(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Path, cert: str, user: str) -> None:
    """A self-contained kubeconfig (certificates embedded)."""
    text = f"""apiVersion: v1
kind: Config
clusters:
  - name: llm-autopilot
    cluster:
      server: {server}
      certificate-authority-data: {b64file(pki / "ca.crt")}
users:
  - name: {user}
    user:
      client-certificate-data: {b64file(pki / f"{cert}.crt")}
      client-key-data: {b64file(pki / f"{cert}.key")}
contexts:
  - name: llm-autopilot
    context:
      cluster: llm-autopilot
      user: {user}
      namespace: default
current-context: llm-autopilot
"""
    path.write_text(text)
    path.chmod(0o600)
