#!/usr/bin/env python3
"""Local Kubernetes control plane for llm-autopilot's end-to-end tests.

There is no Docker and no container registry on the development and CI
machines, so the control plane is built from upstream Go modules and run as
plain processes bound to 127.0.0.1:

* etcd, kube-apiserver, kube-controller-manager, kube-scheduler (real ones);
* kwok, which fakes the kubelets of simulated GPU nodes (NVIDIA GPU Feature
  Discovery labels, ``nvidia.com/gpu`` capacity) and drives pod lifecycles
  through the Stage objects in ``hack/kwok/stages.yaml``;
* kube-state-metrics (metrics about the cluster's objects, for Prometheus);
* Prometheus (Debian's ``/usr/bin/prometheus``, not built here), scraping
  kube-state-metrics and the simulated vLLM pods that ``hack/vllm_sim.py``
  lists in ``<state>/prometheus/vllm-targets/*.json`` (file_sd), plus any
  target listed in ``<state>/prometheus/extra-targets/*.json`` (file_sd job
  ``extra``, e.g. an operator's /metrics; ``hack/vllm_sim.py
  add_scrape_target``), and evaluating the alerting/recording rules in
  ``<state>/prometheus/rules/*.yaml`` (re-read on ``POST /-/reload``).

Components are a table (`COMPONENTS`), started in order, so more can be
added without touching the start/stop logic.

Subcommands::

    cluster.py build [COMPONENT ...]  build (or reuse cached) binaries
    cluster.py up [--no-nodes] [--no-prometheus]
                                      start the cluster, create GPU node pools
    cluster.py nodes [--print]        (re)create the GPU node pools
    cluster.py status                 show the state of every component
    cluster.py env                    print ``export KUBECONFIG=...`` lines
                                      (and LLM_AUTOPILOT_PROMETHEUS_URL, *_DIR)
    cluster.py stop|start COMPONENT   stop/start one component (e.g. prometheus)
    cluster.py down [--keep]          stop everything, remove state
    cluster.py pin                    regenerate hack/tools/*/go.mod from pins

Environment:

* ``LLM_AUTOPILOT_CACHE``: cache root (default ``~/.cache/llm-autopilot``);
  binaries live in ``<cache>/bin/<component>-<version>/``.
* ``LLM_AUTOPILOT_CLUSTER_DIR``: state dir (default ``<cache>/cluster``).
* ``LLM_AUTOPILOT_PORT_BASE``: first port of the block of 100 the cluster
  uses (default 26400; the API server is on base+43).

Only the Python 3.11 standard library, the ``go`` toolchain, the
``openssl`` CLI and (for Prometheus) the Debian ``prometheus`` package are
used.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------
# Pinned versions. After changing one, run `cluster.py pin`: it rewrites the
# wrapper go.mod/go.sum under hack/tools/ (commit them).
# --------------------------------------------------------------------------
K8S_VERSION = "v1.37.2"  # k8s.io/kubernetes; staging modules at v0.37.2
ETCD_VERSION = "v3.6.16"  # go.etcd.io/etcd/server/v3
KWOK_VERSION = "v0.8.0"  # sigs.k8s.io/kwok
KSM_VERSION = "v2.20.0"  # k8s.io/kube-state-metrics/v2

HACK_DIR = Path(__file__).resolve().parent
TOOLS_DIR = HACK_DIR / "tools"
STAGES_FILE = HACK_DIR / "kwok" / "stages.yaml"

DEFAULT_PORT_BASE = 26400
# Offsets inside the port block; kept stable so logs and docs stay readable.
PORT_OFFSETS: dict[str, int] = {
    "kwok": 10,  # kwok's fake kubelet server (healthz, logs, exec)
    "apiserver": 43,
    "controller-manager": 57,
    "scheduler": 59,
    "etcd-client": 79,
    "etcd-peer": 80,
    "kube-state-metrics": 81,
    "kube-state-metrics-telemetry": 82,
    "prometheus": 90,
}

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the kubernetes svc
# Fake pod IPs handed out by kwok. Nothing is listening there and nothing in
# this cluster connects to them: never `kubectl proxy`/port-forward to a pod.
POD_CIDR = "10.244.0.0/16"
NODE_IP = "127.0.0.1"  # node InternalIP: kubelet traffic stays on loopback

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
POOL_LABEL = "llm-autopilot.io/node-pool"

# Prometheus comes from Debian (`apt-get install -y prometheus`, 2.42), not
# from a Go build: its web UI assets make a module build impractical.
PROMETHEUS_BINARY = Path("/usr/bin/prometheus")
PROMTOOL_BINARY = Path("/usr/bin/promtool")
PROMETHEUS_SCRAPE_SECONDS = 2
PROMETHEUS_RETENTION = "6h"
VLLM_TARGETS_REFRESH = "5s"

STOP_GRACE_SECONDS = 10.0
UNHEALTHY_GRACE_SECONDS = 15.0  # before `up` restarts a running, unhealthy component


def log(message: str) -> None:
    """Print a progress line (to stderr, so `env` output stays clean)."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[cluster {stamp}] {message}", file=sys.stderr, flush=True)


def fmt_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


class ClusterError(RuntimeError):
    """A failure worth a one-line message rather than a traceback."""


# ==========================================================================
# Paths
# ==========================================================================
def cache_root() -> Path:
    env = os.environ.get("LLM_AUTOPILOT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-autopilot"


def state_dir() -> Path:
    env = os.environ.get("LLM_AUTOPILOT_CLUSTER_DIR")
    return Path(env).expanduser() if env else cache_root() / "cluster"


# ==========================================================================
# Building binaries
# ==========================================================================
def k8s_version_ldflags(version: str) -> list[str]:
    """`-X` flags that make /version and `kubectl version` report `version`."""
    major, minor = version.lstrip("v").split(".")[:2]
    build_date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    return flags


def ksm_version_ldflags(version: str) -> list[str]:
    pkg = "github.com/prometheus/common/version"
    return [f"-X {pkg}.Version={version.lstrip('v')}", f"-X {pkg}.Branch=release"]


@dataclasses.dataclass(frozen=True)
class Binary:
    """One Go binary built from a pinned upstream module.

    Every binary is built with ``go build`` inside a small wrapper module
    (``hack/tools/<wrapper>/``, committed with its go.sum) rather than with
    ``go install pkg@version``: that refuses modules whose go.mod has
    ``replace`` directives (kubernetes, etcd), and it also reads the module's
    version list, which the module proxy refuses for kube-state-metrics/v2.
    """

    name: str
    version: str
    package: str
    pin_module: str  # module required at `version` by the wrapper's go.mod
    wrapper: str  # directory name under hack/tools/
    ldflags: Callable[[str], list[str]] | None = None

    @property
    def path(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}" / self.name

    def is_built(self) -> bool:
        return self.path.is_file() and os.access(self.path, os.X_OK)


def _k8s_binary(name: str) -> Binary:
    return Binary(
        name=name,
        version=K8S_VERSION,
        package=f"k8s.io/kubernetes/cmd/{name}",
        pin_module="k8s.io/kubernetes",
        wrapper="k8s",
        ldflags=k8s_version_ldflags,
    )


BINARIES: dict[str, Binary] = {
    b.name: b
    for b in (
        _k8s_binary("kube-apiserver"),
        _k8s_binary("kube-controller-manager"),
        _k8s_binary("kube-scheduler"),
        _k8s_binary("kubectl"),
        Binary(
            name="etcd",
            version=ETCD_VERSION,
            package="go.etcd.io/etcd/server/v3",
            pin_module="go.etcd.io/etcd/server/v3",
            wrapper="etcd",
        ),
        Binary(
            name="kwok",
            version=KWOK_VERSION,
            package="sigs.k8s.io/kwok/cmd/kwok",
            pin_module="sigs.k8s.io/kwok",
            wrapper="kwok",
        ),
        Binary(
            name="kube-state-metrics",
            version=KSM_VERSION,
            package="k8s.io/kube-state-metrics/v2",
            pin_module="k8s.io/kube-state-metrics/v2",
            wrapper="ksm",
            ldflags=ksm_version_ldflags,
        ),
    )
}


def go_env(mod_mode: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["GOTOOLCHAIN"] = "local"  # never download another Go toolchain
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-mod=mod -buildvcs=false" if mod_mode else "-buildvcs=false"
    return env


def check_wrapper_pin(binary: Binary) -> Path:
    wrapper = TOOLS_DIR / binary.wrapper
    gomod = (wrapper / "go.mod").read_text()
    if not re.search(
        rf"^\s*(require\s+)?{re.escape(binary.pin_module)} "
        rf"{re.escape(binary.version)}\s*$",
        gomod,
        re.M,
    ):
        raise ClusterError(
            f"{wrapper}/go.mod does not pin {binary.pin_module} {binary.version}; "
            f"run `python3 {Path(__file__).name} pin`"
        )
    return wrapper


def run_with_progress(
    cmd: Sequence[str], *, cwd: Path, env: dict[str, str], log_path: Path, label: str, every: float = 30.0
) -> None:
    """Run a long command, its output to `log_path`, printing a line every `every` s."""
    start = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            while True:
                try:
                    rc = proc.wait(timeout=every)
                    break
                except subprocess.TimeoutExpired:
                    log(f"{label}: still building ({fmt_duration(time.monotonic() - start)})")
        except BaseException:
            proc.terminate()
            proc.wait()
            raise
    if rc != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise ClusterError(f"{label}: build failed (exit {rc}); log {log_path}:\n{tail}")


def build_binary(binary: Binary) -> None:
    label = f"{binary.name} {binary.version}"
    if binary.is_built():
        log(f"{label}: cached at {binary.path}")
        return
    target_dir = binary.path.parent
    target_dir.mkdir(parents=True, exist_ok=True)
    log_path = target_dir / "build.log"
    ldflags = " ".join(["-s", "-w", *(binary.ldflags(binary.version) if binary.ldflags else [])])
    log(f"{label}: building {binary.package} (log: {log_path})")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=target_dir, prefix=".tmp-") as tmp:
        tmp_path = Path(tmp)
        cmd = ["go", "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp_path / binary.name)]
        run_with_progress(
            [*cmd, binary.package],
            cwd=check_wrapper_pin(binary),
            env=go_env(mod_mode=True),
            log_path=log_path,
            label=label,
        )
        built = tmp_path / binary.name
        if not built.is_file():
            raise ClusterError(f"{label}: go produced no {binary.name} in {tmp_path}")
        os.replace(built, binary.path)  # atomic: a half-built binary never counts
    log(f"{label}: built in {fmt_duration(time.monotonic() - start)}")


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Serialise builds across processes (two Go builds at once thrash 2 cores)."""
    lock_path = cache_root() / "bin" / ".build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build to finish (lock {lock_path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in BINARIES]
    if unknown:
        raise ClusterError(f"unknown component(s) {unknown}; known: {list(BINARIES)}")
    wanted = [BINARIES[n] for n in names] if names else list(BINARIES.values())
    missing = [b for b in wanted if not b.is_built()]
    if not missing:
        log(f"all {len(wanted)} binaries cached under {cache_root() / 'bin'}")
        return
    if shutil.which("go") is None:
        raise ClusterError("`go` is not on PATH")
    start = time.monotonic()
    with build_lock():
        for binary in wanted:  # sequential on purpose: 2 cores, large links
            build_binary(binary)
    log(f"build finished in {fmt_duration(time.monotonic() - start)}")


# ==========================================================================
# `pin`: generate the wrapper modules from the pinned upstream versions
# ==========================================================================
def go_mod_download(module: str, version: str) -> dict[str, Any]:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        env=go_env(mod_mode=False),
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    ).stdout
    info: dict[str, Any] = json.loads(out)
    return info


def write_wrapper(
    name: str,
    requires: dict[str, str],
    replaces: dict[str, str],
    imports: Sequence[str],
    header: str,
    *,
    godebug: Sequence[str] = (),
) -> None:
    """Write hack/tools/<name>/{go.mod,tools.go} and resolve go.sum with `go mod tidy`."""
    wrapper = TOOLS_DIR / name
    wrapper.mkdir(parents=True, exist_ok=True)
    lines = [f"module llm-autopilot/hack/tools/{name}", "", "go 1.26.0", ""]
    lines += [*godebug, ""] if godebug else []
    lines += ["require ("] + [f"\t{m} {v}" for m, v in requires.items()] + [")", ""]
    if replaces:
        lines += ["replace ("] + [f"\t{m} => {m} {v}" for m, v in replaces.items()] + [")"]
    (wrapper / "go.mod").write_text("\n".join(lines) + "\n")
    body = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (wrapper / "tools.go").write_text(
        f"//go:build tools\n\n// Package tools {header}\npackage tools\n\nimport (\n{body}\n)\n"
    )
    (wrapper / "go.sum").unlink(missing_ok=True)
    log(f"go mod tidy in {wrapper}")
    subprocess.run(["go", "mod", "tidy"], cwd=wrapper, env=go_env(mod_mode=True), check=True)


def pin() -> None:
    k8s = go_mod_download("k8s.io/kubernetes", K8S_VERSION)
    gomod = Path(k8s["GoMod"]).read_text()
    staging = re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/src/", gomod, re.M)
    if not staging:
        raise ClusterError("found no staging replaces in k8s.io/kubernetes go.mod")
    staging_version = "v0." + K8S_VERSION.split(".", 1)[1]
    write_wrapper(
        "k8s",
        {"k8s.io/kubernetes": K8S_VERSION},
        dict.fromkeys(staging, staging_version),
        [BINARIES[n].package for n in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")],
        "pins the Kubernetes commands built by hack/cluster.py. k8s.io/kubernetes\n"
        "// requires its staging modules at v0.0.0, so each one is replaced by its\n"
        "// published version (list generated from the release's own go.mod).",
        godebug=re.findall(r"^godebug .*$", gomod, re.M),
    )
    for name in ("etcd", "kwok", "kube-state-metrics"):
        binary = BINARIES[name]
        write_wrapper(
            binary.wrapper,
            {binary.pin_module: binary.version},
            {},
            [binary.package],
            f"pins {binary.pin_module} {binary.version} for hack/cluster.py.",
        )


# ==========================================================================
# Certificates and kubeconfigs (openssl CLI)
# ==========================================================================
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


# ==========================================================================
# Cluster state
# ==========================================================================
@dataclasses.dataclass
class Cluster:
    """Paths and ports of one local cluster (persisted in cluster.json)."""

    root: Path
    ports: dict[str, int]
    disabled: list[str] = dataclasses.field(default_factory=list)  # e.g. ["prometheus"] (`up --no-prometheus`)

    @classmethod
    def load(cls, *, fresh: bool = False) -> Cluster:
        """The cluster in the state dir; `fresh` ignores its saved ports."""
        root = state_dir()
        meta = root / "cluster.json"
        base = int(os.environ.get("LLM_AUTOPILOT_PORT_BASE", DEFAULT_PORT_BASE))
        defaults = {k: base + off for k, off in PORT_OFFSETS.items()}
        if meta.exists() and not fresh:
            data = json.loads(meta.read_text())
            # a state dir from before a port key existed gets it from the same base
            saved_base = int(data["ports"].get("apiserver", base + PORT_OFFSETS["apiserver"])) - PORT_OFFSETS[
                "apiserver"
            ]
            ports = {k: saved_base + off for k, off in PORT_OFFSETS.items()}
            ports.update({k: int(v) for k, v in data["ports"].items()})
            return cls(root=root, ports=ports, disabled=list(data.get("disabled", [])))
        return cls(root=root, ports=defaults)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "ports": self.ports,
            "versions": {n: b.version for n, b in BINARIES.items()},
            "disabled": self.disabled,
        }
        (self.root / "cluster.json").write_text(json.dumps(data, indent=2) + "\n")

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / "kubeconfigs" / f"{name}.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd-client']}"

    def log_file(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.root / "run" / f"{name}.pid"

    def data_dir(self, name: str) -> Path:
        return self.root / "data" / name

    @property
    def prometheus_dir(self) -> Path:
        """Generated Prometheus config and the file_sd directory for vLLM targets."""
        return self.root / "prometheus"

    @property
    def vllm_targets_dir(self) -> Path:
        return self.prometheus_dir / "vllm-targets"

    @property
    def extra_targets_dir(self) -> Path:
        """file_sd directory of the ``extra`` scrape job (targets may set their own ``job`` label)."""
        return self.prometheus_dir / "extra-targets"

    @property
    def prometheus_rules_dir(self) -> Path:
        """Prometheus rule files (``*.yaml``), loaded at start and on ``POST <url>/-/reload``."""
        return self.prometheus_dir / "rules"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}"


# ==========================================================================
# Talking to the API server (stdlib HTTPS with the admin client certificate)
# ==========================================================================
class Api:
    def __init__(self, cluster: Cluster) -> None:
        self.base = cluster.server
        if not (cluster.pki / "admin.crt").exists():
            raise ClusterError(f"no cluster in {cluster.root}: run `cluster.py up`")
        self.ctx = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(cluster.pki / "admin.crt"), str(cluster.pki / "admin.key"))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw, status = err.read(), err.code
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def ok(self, path: str) -> bool:
        try:
            return self.request("GET", path, timeout=3.0)[0] == 200
        except OSError:
            return False


def http_ok(url: str, timeout: float = 3.0) -> bool:
    """GET `url` (no certificate verification: local self-signed endpoints)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


# ==========================================================================
# Components
# ==========================================================================
def etcd_args(c: Cluster) -> list[str]:
    peer = f"http://127.0.0.1:{c.ports['etcd-peer']}"
    return [
        "--name=llm-autopilot",
        f"--data-dir={c.data_dir('etcd')}",
        f"--listen-client-urls={c.etcd_url}",
        f"--advertise-client-urls={c.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=llm-autopilot={peer}",
        "--initial-cluster-state=new",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=2147483648",
        "--unsafe-no-fsync=true",  # throwaway test data: trade durability for speed
        "--log-level=warn",
    ]


def apiserver_args(c: Cluster) -> list[str]:
    pki = c.pki
    return [
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={c.ports['apiserver']}",
        f"--etcd-servers={c.etcd_url}",
        f"--cert-dir={c.data_dir('kube-apiserver')}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The lease reconciler would publish 127.0.0.1 as the endpoint of the
        # `kubernetes` Service, which endpoint validation rejects (loopback).
        "--endpoint-reconciler-type=none",
        # kwok's fake kubelet endpoint (logs/exec) is on loopback too.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        "--profiling=false",
    ]


def controller_manager_args(c: Cluster) -> list[str]:
    kc = c.component_kubeconfig("controller-manager")
    return [
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={c.ports['controller-manager']}",
        f"--cert-dir={c.data_dir('kube-controller-manager')}",
        "--leader-elect=false",
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={c.pki / 'sa.key'}",
        f"--root-ca-file={c.pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={c.pki / 'ca.crt'}",
        f"--cluster-signing-key-file={c.pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false",
    ]


def scheduler_args(c: Cluster) -> list[str]:
    kc = c.component_kubeconfig("scheduler")
    config = c.root / "kube-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection:\n  kubeconfig: {kc}\n"
        "leaderElection:\n  leaderElect: false\n"
    )
    return [
        f"--config={config}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={c.ports['scheduler']}",
        f"--cert-dir={c.data_dir('kube-scheduler')}",
        "--profiling=false",
    ]


def kwok_args(c: Cluster) -> list[str]:
    port = c.ports["kwok"]
    return [
        f"--kubeconfig={c.kubeconfig}",
        f"--config={STAGES_FILE}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={POD_CIDR}",
        f"--node-ip={NODE_IP}",
        f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}",  # default would be 0.0.0.0
        f"--tls-cert-file={c.pki / 'kwok.crt'}",
        f"--tls-private-key-file={c.pki / 'kwok.key'}",
        "--node-lease-duration-seconds=40",
    ]


def kube_state_metrics_args(c: Cluster) -> list[str]:
    return [
        f"--kubeconfig={c.kubeconfig}",
        "--host=127.0.0.1",  # default would be ::
        f"--port={c.ports['kube-state-metrics']}",
        "--telemetry-host=127.0.0.1",
        f"--telemetry-port={c.ports['kube-state-metrics-telemetry']}",
        # kube_node_labels with the GFD labels, kube_pod_labels, ...
        "--metric-labels-allowlist=nodes=[*],pods=[*],deployments=[*]",
    ]


def prometheus_config(c: Cluster) -> str:
    """prometheus.yml: kube-state-metrics and the file_sd-listed vLLM pods, every 2 s.

    A vLLM target in ``<state>/prometheus/vllm-targets/*.json`` looks like
    ``{"targets": ["127.0.0.1:PORT"], "labels": {"namespace": NS, "pod": POD,
    "__metrics_path__": "/metrics/NS/POD"}}``: the ``namespace``/``pod``
    target labels are what a ServiceMonitor's standard relabelling gives, so
    queries written for a real cluster work unchanged (extra labels, e.g. the
    PodMonitor's ``llmdeployment``, can be set per pod by the simulator).

    Job ``extra`` scrapes whatever ``<state>/prometheus/extra-targets/*.json``
    lists; a target group may set ``job`` (and ``namespace``, ...) itself, as
    target-group labels win over the job name, e.g.
    ``{"targets": ["127.0.0.1:PORT"], "labels": {"job": "llm-autopilot",
    "namespace": "llm-autopilot-system"}}`` for an operator's /metrics.

    Rules: every ``<state>/prometheus/rules/*.yaml`` (evaluated every 2 s).
    Prometheus reads them at start; after adding, changing or removing a
    file, ``POST <prometheus url>/-/reload`` (``--web.enable-lifecycle``)
    loads the new set, and ``GET /api/v1/rules`` shows each group's health.
    """
    every = f"{PROMETHEUS_SCRAPE_SECONDS}s"
    cfg = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "scrape_configs": [
            {
                "job_name": "kube-state-metrics",
                "scrape_interval": every,
                "scrape_timeout": every,
                "honor_labels": True,  # keep KSM's own namespace/pod/container labels
                "static_configs": [{"targets": [f"127.0.0.1:{c.ports['kube-state-metrics']}"]}],
            },
            {
                "job_name": "vllm",
                "scrape_interval": every,
                "scrape_timeout": every,
                "file_sd_configs": [
                    {"files": [str(c.vllm_targets_dir / "*.json")], "refresh_interval": VLLM_TARGETS_REFRESH}
                ],
            },
            {
                "job_name": "extra",
                "scrape_interval": every,
                "scrape_timeout": every,
                "file_sd_configs": [
                    {"files": [str(c.extra_targets_dir / "*.json")], "refresh_interval": VLLM_TARGETS_REFRESH}
                ],
            },
        ],
        "rule_files": [str(c.prometheus_rules_dir / "*.yaml")],
    }
    # JSON is valid YAML; Prometheus reads it as its YAML config.
    return "# generated by hack/cluster.py; rewritten on every start\n" + json.dumps(cfg, indent=2) + "\n"


def prepare_prometheus(c: Cluster) -> None:
    """Write prometheus.yml (validated by promtool) and create the file_sd and rules dirs."""
    c.vllm_targets_dir.mkdir(parents=True, exist_ok=True)
    c.extra_targets_dir.mkdir(parents=True, exist_ok=True)
    c.prometheus_rules_dir.mkdir(parents=True, exist_ok=True)
    c.data_dir("prometheus").mkdir(parents=True, exist_ok=True)
    config = c.prometheus_dir / "prometheus.yml"
    config.write_text(prometheus_config(c))
    if PROMTOOL_BINARY.exists():
        check = subprocess.run(
            [str(PROMTOOL_BINARY), "check", "config", str(config)], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise ClusterError(f"promtool check config {config} failed:\n{check.stdout}{check.stderr}")
    else:
        log(f"prometheus: {PROMTOOL_BINARY} missing, config not validated")


def prometheus_args(c: Cluster) -> list[str]:
    return [
        f"--config.file={c.prometheus_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={c.data_dir('prometheus')}",
        f"--storage.tsdb.retention.time={PROMETHEUS_RETENTION}",
        f"--web.listen-address=127.0.0.1:{c.ports['prometheus']}",
        "--web.enable-lifecycle",  # POST /-/reload
        # POST /api/v1/admin/tsdb/delete_series: tests drop series left by earlier runs (e.g. counters an
        # alert's increase() window would still see); loopback-only, throwaway data
        "--web.enable-admin-api",
        "--log.level=warn",
    ]


def release_node_leases(c: Cluster) -> None:
    """Delete node Leases left by a previous kwok process.

    kwok's lease holder identity is random per process, so a restarted kwok
    would leave the nodes alone until its predecessor's leases expire (40 s).
    """
    code, body = Api(c).request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    if code != 200:
        raise ClusterError(f"deleting stale node leases: {code} {body}")


@dataclasses.dataclass(frozen=True)
class Component:
    """A process of the local cluster; `COMPONENTS` is started in this order.

    To add one (kube-state-metrics, Prometheus, ...): write its `*_args`
    function, give it a health check and the `PORT_OFFSETS` keys it listens
    on, and append it to `COMPONENTS`.
    """

    name: str
    binary: str  # key of BINARIES (built from Go modules), unless `system_binary`
    args: Callable[[Cluster], list[str]]
    healthy: Callable[[Cluster], bool]
    ports: tuple[str, ...]  # keys of Cluster.ports it listens on
    start_timeout: float = 90.0
    before_start: Callable[[Cluster], None] | None = None
    system_binary: Path | None = None  # an OS package's binary instead of a built one
    optional: bool = False  # `up --no-<name>` skips it

    @property
    def executable(self) -> Path:
        return self.system_binary if self.system_binary else BINARIES[self.binary].path


def https_healthz(port_key: str) -> Callable[[Cluster], bool]:
    return lambda c: http_ok(f"https://127.0.0.1:{c.ports[port_key]}/healthz")


COMPONENTS: tuple[Component, ...] = (
    Component(
        "etcd",
        "etcd",
        etcd_args,
        lambda c: http_ok(f"{c.etcd_url}/health"),
        ports=("etcd-client", "etcd-peer"),
    ),
    Component(
        "kube-apiserver",
        "kube-apiserver",
        apiserver_args,
        lambda c: Api(c).ok("/readyz"),
        ports=("apiserver",),
        start_timeout=120.0,
    ),
    Component(
        "kube-controller-manager",
        "kube-controller-manager",
        controller_manager_args,
        https_healthz("controller-manager"),
        ports=("controller-manager",),
    ),
    Component(
        "kube-scheduler",
        "kube-scheduler",
        scheduler_args,
        https_healthz("scheduler"),
        ports=("scheduler",),
    ),
    Component(
        "kwok",
        "kwok",
        kwok_args,
        lambda c: http_ok(f"http://127.0.0.1:{c.ports['kwok']}/healthz"),
        ports=("kwok",),
        before_start=release_node_leases,
    ),
    Component(
        "kube-state-metrics",
        "kube-state-metrics",
        kube_state_metrics_args,
        lambda c: http_ok(f"http://127.0.0.1:{c.ports['kube-state-metrics']}/healthz"),
        ports=("kube-state-metrics", "kube-state-metrics-telemetry"),
    ),
    Component(
        "prometheus",
        "prometheus",
        prometheus_args,
        lambda c: http_ok(f"{c.prometheus_url}/-/ready"),
        ports=("prometheus",),
        start_timeout=60.0,
        before_start=prepare_prometheus,
        system_binary=PROMETHEUS_BINARY,
        optional=True,
    ),
)
COMPONENT_NAMES = tuple(c.name for c in COMPONENTS)


def component(name: str) -> Component:
    for comp in COMPONENTS:
        if comp.name == name:
            return comp
    raise ClusterError(f"unknown component {name!r}; known: {', '.join(COMPONENT_NAMES)}")


def enabled_components(cluster: Cluster) -> list[Component]:
    return [c for c in COMPONENTS if c.name not in cluster.disabled]


def check_system_binary(comp: Component) -> None:
    if comp.system_binary and not os.access(comp.system_binary, os.X_OK):
        hint = f" (or `up --no-{comp.name}`)" if comp.optional else ""
        raise ClusterError(
            f"{comp.name}: {comp.system_binary} not found. Install it with "
            f"`apt-get install -y {comp.name}`{hint}"
        )


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like Go's listeners: TIME_WAIT leftovers do not block, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_ports_free(cluster: Cluster, comp: Component) -> None:
    """Refuse to start next to a foreign listener (its health check would lie)."""
    busy = [cluster.ports[k] for k in comp.ports if port_in_use(cluster.ports[k])]
    if busy:
        raise ClusterError(
            f"{comp.name}: 127.0.0.1 port(s) {busy} already in use, probably by another "
            "cluster; set LLM_AUTOPILOT_PORT_BASE (and LLM_AUTOPILOT_CLUSTER_DIR) "
            f"or stop it. State: {cluster.root}"
        )


def read_pid(cluster: Cluster, comp: Component) -> int | None:
    """PID of the component if its recorded process still runs our binary."""
    try:
        pid = int(cluster.pid_file(comp.name).read_text().split()[0])
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError, IndexError):
        return None
    expected = str(comp.executable.resolve())
    return pid if exe.removesuffix(" (deleted)") == expected else None


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_component(cluster: Cluster, comp: Component) -> None:
    log_path = cluster.log_file(comp.name)
    cmd = [str(comp.executable), *comp.args(cluster)]
    start = time.monotonic()
    with log_path.open("a") as out:
        out.write(f"\n==== {datetime.datetime.now(datetime.UTC).isoformat()} {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cluster.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    cluster.pid_file(comp.name).write_text(f"{proc.pid}\n")
    deadline = start + comp.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ClusterError(f"{comp.name} exited with {proc.returncode}; log {log_path}:\n{tail(log_path)}")
        if comp.healthy(cluster):
            log(f"{comp.name}: up (pid {proc.pid}, {fmt_duration(time.monotonic() - start)})")
            return
        time.sleep(0.5)
    raise ClusterError(f"{comp.name} not healthy after {comp.start_timeout:.0f}s; log {log_path}:\n{tail(log_path)}")


def wait_healthy(cluster: Cluster, comp: Component, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not comp.healthy(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)
    log(f"{what}: ok ({fmt_duration(time.monotonic() - start)})")


def up(with_nodes: bool, disabled: Sequence[str] = ()) -> None:
    start = time.monotonic()
    cluster = Cluster.load()
    cluster.disabled = list(disabled)
    wanted = enabled_components(cluster)
    for comp in wanted:
        check_system_binary(comp)
    running = [c for c in COMPONENTS if read_pid(cluster, c) and c.healthy(cluster)]
    if all(c in running for c in wanted):
        log(f"cluster is already up at {cluster.server} (state {cluster.root})")
        cluster.save()
        if with_nodes:
            create_nodes(Api(cluster))
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return
    if not running:  # nothing runs: take ports from the environment again
        cluster = Cluster.load(fresh=True)
        cluster.disabled = list(disabled)
    build(sorted({c.binary for c in wanted if not c.system_binary} | {"kubectl"}))
    cluster.save()
    for sub in ("logs", "run", "kubeconfigs", "data"):
        (cluster.root / sub).mkdir(parents=True, exist_ok=True)
    ensure_pki(cluster.pki)
    write_kubeconfig(cluster.kubeconfig, cluster.server, cluster.pki, "admin", "llm-autopilot-admin")
    for name, (cert, subject) in CLIENT_IDENTITIES.items():
        user = subject.rsplit("CN=", 1)[1]
        write_kubeconfig(cluster.component_kubeconfig(name), cluster.server, cluster.pki, cert, user)
    for comp in wanted:
        if comp in running:
            log(f"{comp.name}: already running (pid {read_pid(cluster, comp)})")
            continue
        stale = read_pid(cluster, comp)
        if stale and not wait_healthy(cluster, comp, UNHEALTHY_GRACE_SECONDS):
            log(f"{comp.name}: running but unhealthy for {UNHEALTHY_GRACE_SECONDS:.0f}s, restarting it")
            stop_pid(comp.name, stale)
        elif stale:
            log(f"{comp.name}: running (pid {stale})")
            continue
        check_ports_free(cluster, comp)
        if comp.before_start:
            comp.before_start(cluster)
        start_component(cluster, comp)
    api = Api(cluster)
    wait_for("namespace default", lambda: api.ok("/api/v1/namespaces/default"), 60)
    wait_for(
        "serviceaccount default/default",
        lambda: api.ok("/api/v1/namespaces/default/serviceaccounts/default"),
        90,
    )
    if with_nodes:
        create_nodes(api)
    if "prometheus" not in cluster.disabled:
        log(f"prometheus: {cluster.prometheus_url} (vLLM file_sd targets: {cluster.vllm_targets_dir})")
    log(f"cluster up in {fmt_duration(time.monotonic() - start)}; KUBECONFIG={cluster.kubeconfig}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")


def stop_pid(name: str, pid: int) -> None:
    """SIGTERM the component's process group, SIGKILL it after a grace period."""

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie (our own child) counts as gone
            return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return False

    def signal_group(sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # started with start_new_session: pgid == pid
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive():
        log(f"{name}: still running after {STOP_GRACE_SECONDS:.0f}s, sending SIGKILL")
        signal_group(signal.SIGKILL)
        while alive():
            time.sleep(0.1)
    log(f"{name}: stopped (pid {pid})")


def down(keep: bool) -> None:
    cluster = Cluster.load()
    for comp in reversed(COMPONENTS):
        pid = read_pid(cluster, comp)
        if pid:
            stop_pid(comp.name, pid)
        cluster.pid_file(comp.name).unlink(missing_ok=True)
    if not keep and cluster.root.exists():
        shutil.rmtree(cluster.root)
        log(f"removed {cluster.root}")
    elif keep:
        log(f"kept state in {cluster.root}")


def status() -> int:
    cluster = Cluster.load()
    if not (cluster.root / "cluster.json").exists():
        print(f"no cluster state in {cluster.root}")
        return 1
    all_ok = True
    for comp in COMPONENTS:
        pid = read_pid(cluster, comp)
        if pid is None and comp.name in cluster.disabled:
            state = "disabled"
        elif pid is None:
            state, all_ok = "stopped", False
        elif comp.healthy(cluster):
            state = "healthy"
        else:
            state, all_ok = "unhealthy", False
        print(f"{comp.name:<24} {state:<10} pid={pid or '-':<8} log={cluster.log_file(comp.name)}")
    apiserver = next(c for c in COMPONENTS if c.name == "kube-apiserver")
    if read_pid(cluster, apiserver):
        api = Api(cluster)
        try:
            _, version = api.request("GET", "/version")
            _, nodes = api.request("GET", "/api/v1/nodes")
        except OSError as err:
            print(f"{'api':<24} {cluster.server} unreachable: {err}")
        else:
            items = nodes.get("items", []) if isinstance(nodes, dict) else []
            ready = sum(1 for n in items if node_ready(n))
            git = version.get("gitVersion") if isinstance(version, dict) else version
            print(f"{'api':<24} {cluster.server} version={git} nodes={ready}/{len(items)} Ready")
    print(f"{'kubeconfig':<24} {cluster.kubeconfig}")
    if "prometheus" not in cluster.disabled:
        print(f"{'prometheus url':<24} {cluster.prometheus_url}")
        print(f"{'vllm targets (file_sd)':<24} {cluster.vllm_targets_dir}")
        print(f"{'extra targets (file_sd)':<24} {cluster.extra_targets_dir}")
        print(f"{'prometheus rules':<24} {cluster.prometheus_rules_dir} (POST {cluster.prometheus_url}/-/reload)")
    return 0 if all_ok else 1


def env() -> None:
    cluster = Cluster.load()
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={BINARIES['kubectl'].path.parent}:$PATH")
    if "prometheus" not in cluster.disabled:
        print(f"export LLM_AUTOPILOT_PROMETHEUS_URL={cluster.prometheus_url}")
        print(f"export LLM_AUTOPILOT_VLLM_TARGETS_DIR={cluster.vllm_targets_dir}")
        print(f"export LLM_AUTOPILOT_EXTRA_TARGETS_DIR={cluster.extra_targets_dir}")
        print(f"export LLM_AUTOPILOT_PROMETHEUS_RULES_DIR={cluster.prometheus_rules_dir}")


def stop_one(name: str) -> None:
    """Stop one component (e.g. Prometheus, to simulate an outage); state is kept."""
    cluster = Cluster.load()
    comp = component(name)
    pid = read_pid(cluster, comp)
    if pid:
        stop_pid(comp.name, pid)
    else:
        log(f"{comp.name}: not running")
    cluster.pid_file(comp.name).unlink(missing_ok=True)


def start_one(name: str) -> None:
    """Start one stopped component again and wait until it is healthy."""
    cluster = Cluster.load()
    comp = component(name)
    if not (cluster.root / "cluster.json").exists():
        raise ClusterError(f"no cluster state in {cluster.root}: run `cluster.py up` first")
    check_system_binary(comp)
    pid = read_pid(cluster, comp)
    if pid and comp.healthy(cluster):
        log(f"{comp.name}: already running (pid {pid})")
        return
    if pid:
        log(f"{comp.name}: running but unhealthy, restarting it")
        stop_pid(comp.name, pid)
    if comp.name in cluster.disabled:
        cluster.disabled.remove(comp.name)
        cluster.save()
    check_ports_free(cluster, comp)
    if comp.before_start:
        comp.before_start(cluster)
    start_component(cluster, comp)


# ==========================================================================
# Simulated GPU node pools
# ==========================================================================
@dataclasses.dataclass(frozen=True)
class GpuPool:
    """A pool of identical fake GPU nodes, labelled like NVIDIA GFD would."""

    name: str
    count: int
    instance_type: str
    gpu_product: str  # nvidia.com/gpu.product (GFD-sanitised NVML name)
    gpu_memory_mib: int
    gpu_family: str
    compute: tuple[int, int]
    gpus: int
    cpu: int
    memory: str
    driver: str = "550.127.05"
    cuda: str = "12.4"


GPU_POOLS: tuple[GpuPool, ...] = (
    GpuPool(
        "h100",
        2,
        "gpu-8x-h100-80gb",
        "NVIDIA-H100-80GB-HBM3",
        81559,
        "hopper",
        (9, 0),
        gpus=8,
        cpu=208,
        memory="1843Gi",
    ),
    GpuPool(
        "a100",
        2,
        "gpu-8x-a100-40gb",
        "NVIDIA-A100-SXM4-40GB",
        40960,
        "ampere",
        (8, 0),
        gpus=8,
        cpu=96,
        memory="1152Gi",
    ),
    GpuPool("l4", 4, "gpu-1x-l4", "NVIDIA-L4", 23034, "ada-lovelace", (8, 9), gpus=1, cpu=48, memory="192Gi"),
)


def node_manifests() -> Iterator[dict[str, Any]]:
    for pool in GPU_POOLS:
        for i in range(pool.count):
            name = f"gpu-{pool.name}-{i}"
            driver_major, driver_minor, driver_rev = pool.driver.split(".")
            cuda_major, cuda_minor = pool.cuda.split(".")
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": pool.instance_type,
                "type": "kwok",
                POOL_LABEL: pool.name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": pool.gpu_product,
                "nvidia.com/gpu.memory": str(pool.gpu_memory_mib),
                "nvidia.com/gpu.count": str(pool.gpus),
                "nvidia.com/gpu.family": pool.gpu_family,
                "nvidia.com/gpu.compute.major": str(pool.compute[0]),
                "nvidia.com/gpu.compute.minor": str(pool.compute[1]),
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.mode": "compute",
                "nvidia.com/cuda.driver-version.major": driver_major,
                "nvidia.com/cuda.driver-version.minor": driver_minor,
                "nvidia.com/cuda.driver-version.revision": driver_rev,
                "nvidia.com/cuda.driver-version.full": pool.driver,
                "nvidia.com/cuda.runtime-version.major": cuda_major,
                "nvidia.com/cuda.runtime-version.minor": cuda_minor,
                "nvidia.com/cuda.runtime-version.full": pool.cuda,
            }
            capacity = {
                "cpu": str(pool.cpu),
                "memory": pool.memory,
                "ephemeral-storage": "3500Gi",
                "pods": "110",
                "nvidia.com/gpu": str(pool.gpus),
            }
            allocatable = dict(capacity, cpu=f"{pool.cpu * 1000 - 500}m")
            yield {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"taints": [{"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": allocatable},
            }


def node_ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node.get("status", {}).get("conditions", [])
    )


def create_nodes(api: Api) -> None:
    manifests = list(node_manifests())
    for manifest in manifests:
        code, body = api.request("POST", "/api/v1/nodes", manifest)
        if code not in (201, 409):
            raise ClusterError(f"creating node {manifest['metadata']['name']}: {code} {body}")

    def all_ready() -> bool:
        code, nodes = api.request("GET", f"/api/v1/nodes?labelSelector={POOL_LABEL}")
        items = nodes.get("items", []) if code == 200 else []
        return len(items) >= len(manifests) and all(node_ready(n) for n in items)

    wait_for(f"{len(manifests)} GPU nodes Ready", all_ready, 120)


def nodes(print_only: bool) -> None:
    if print_only:
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(node_manifests())}, indent=2))
        return
    create_nodes(Api(Cluster.load()))


# ==========================================================================
# CLI
# ==========================================================================
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (or reuse cached) binaries")
    p_build.add_argument("components", nargs="*", metavar="COMPONENT", help=f"subset of {', '.join(BINARIES)}")
    p_up = sub.add_parser("up", help="start the cluster (idempotent)")
    p_up.add_argument("--no-nodes", action="store_true", help="skip the GPU node pools")
    for comp in COMPONENTS:
        if comp.optional:
            p_up.add_argument(f"--no-{comp.name}", action="append_const", const=comp.name, dest="disabled",
                              help=f"do not start {comp.name}")
    p_stop = sub.add_parser("stop", help="stop one component (state kept), e.g. `stop prometheus`")
    p_stop.add_argument("component", choices=COMPONENT_NAMES)
    p_start = sub.add_parser("start", help="start one stopped component, e.g. `start prometheus`")
    p_start.add_argument("component", choices=COMPONENT_NAMES)
    p_down = sub.add_parser("down", help="stop the cluster")
    p_down.add_argument("--keep", action="store_true", help="keep the state directory")
    sub.add_parser("env", help="print shell exports for KUBECONFIG and kubectl")
    sub.add_parser("status", help="print the state of each component")
    p_nodes = sub.add_parser("nodes", help="create the simulated GPU node pools")
    p_nodes.add_argument("--print", action="store_true", help="print manifests only")
    sub.add_parser("pin", help="regenerate hack/tools wrapper modules from the pins")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.components)
        elif args.command == "up":
            up(with_nodes=not args.no_nodes, disabled=args.disabled or ())
        elif args.command == "down":
            down(keep=args.keep)
        elif args.command == "stop":
            stop_one(args.component)
        elif args.command == "start":
            start_one(args.component)
        elif args.command == "env":
            env()
        elif args.command == "status":
            return status()
        elif args.command == "nodes":
            nodes(print_only=args.print)
        elif args.command == "pin":
            pin()
    except ClusterError as err:
        log(f"error: {err}")
        if args.command == "up":
            log("components that did start are still running: `cluster.py down` stops them")
        return 1
    except urllib.error.URLError as err:
        log(f"error: API request failed: {err.reason} (is the cluster up? `cluster.py status`)")
        return 1
    except subprocess.CalledProcessError as err:
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else err.stderr
        log(f"error: {' '.join(map(str, err.cmd))} failed ({err.returncode}): {stderr or ''}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
