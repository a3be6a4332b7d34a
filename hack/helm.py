#!/usr/bin/env python3
"""Helm, and the third-party CRDs the chart's optional objects need, for the local control plane.

Like the binaries of ``hack/cluster.py``, ``helm`` is built from its Go module at a pinned version
inside a wrapper module (``hack/tools/helm/``: go.mod, go.sum, tools.go) and cached under
``<cache>/bin/helm-<version>/helm``. The CRDs of ServiceMonitor/PodMonitor/PrometheusRule
(prometheus-operator) and Certificate/Issuer (cert-manager) are read from those projects' Go modules
(``go mod download -json``, then the YAML in the module directory) and copied into
``<cache>/crds/<project>-<version>/``; they are never committed.

Subcommands::

    helm.py build            build (or reuse) the pinned helm
    helm.py path             print the helm binary's path (builds it first when missing)
    helm.py crds             fetch the third-party CRDs; print the directory of each project
    helm.py crds --print     print every CRD file path (one per line)
    helm.py pin              regenerate hack/tools/helm/{go.mod,go.sum,tools.go} from HELM_VERSION

Environment: ``LLM_AUTOPILOT_CACHE`` (cache root, default ``~/.cache/llm-autopilot``).
Progress lines go to stderr; stdout carries only the answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------
# Pins. After changing HELM_VERSION run `helm.py pin` and commit hack/tools/helm/.
# --------------------------------------------------------------------------
HELM_VERSION = "v3.22.0"  # helm.sh/helm/v3 (go.mod says go 1.26.0, k8s.io modules v0.37.0)
HELM_MODULE = "helm.sh/helm/v3"
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"
HELM_K8S_MINOR = "37"  # the k8s.io modules helm v3.22.0 is built with (`helm template`'s default kube version)

PROMETHEUS_OPERATOR_VERSION = "v0.85.0"  # github.com/prometheus-operator/prometheus-operator
CERT_MANAGER_VERSION = "v1.21.2"  # github.com/cert-manager/cert-manager

HACK_DIR = Path(__file__).resolve().parent
WRAPPER = HACK_DIR / "tools" / "helm"


@dataclasses.dataclass(frozen=True)
class CRDSource:
    """CRD manifests published inside a project's Go module."""

    name: str
    module: str
    version: str
    directory: str  # inside the module
    files: tuple[str, ...]


CRD_SOURCES: dict[str, CRDSource] = {
    s.name: s
    for s in (
        CRDSource(
            name="prometheus-operator",
            module="github.com/prometheus-operator/prometheus-operator",
            version=PROMETHEUS_OPERATOR_VERSION,
            directory="example/prometheus-operator-crd",
            files=(
                "monitoring.coreos.com_servicemonitors.yaml",
                "monitoring.coreos.com_podmonitors.yaml",
                "monitoring.coreos.com_prometheusrules.yaml",
            ),
        ),
        CRDSource(
            name="cert-manager",
            module="github.com/cert-manager/cert-manager",
            version=CERT_MANAGER_VERSION,
            directory="deploy/crds",
            files=("cert-manager.io_certificates.yaml", "cert-manager.io_issuers.yaml"),
        ),
    )
}


# Shared with the control-plane builder: cache layout, Go environment, the one-build-at-a-time lock and the
# progress-printing runner.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster.binaries import build_lock, go_env, run_with_progress  # noqa: E402
from localcluster.paths import ClusterError, cache_root, fmt_duration  # noqa: E402


class HelmToolError(RuntimeError):
    """A failure worth a one-line message rather than a traceback."""


def log(message: str) -> None:
    """A progress line on stderr (stdout stays machine-readable)."""
    print(f"[helm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def helm_path() -> Path:
    return cache_root() / "bin" / f"helm-{HELM_VERSION}" / "helm"


def check_wrapper_pin() -> None:
    gomod = (WRAPPER / "go.mod").read_text()
    if not re.search(rf"^\s*(require\s+)?{re.escape(HELM_MODULE)} {re.escape(HELM_VERSION)}\s*$", gomod, re.M):
        raise HelmToolError(f"{WRAPPER}/go.mod does not pin {HELM_MODULE} {HELM_VERSION}; run `helm.py pin`")


def ldflags() -> str:
    major = HELM_VERSION.lstrip("v").split(".")[0]
    flags = ["-s", "-w", f"-X helm.sh/helm/v{major}/internal/version.version={HELM_VERSION}",
             f"-X helm.sh/helm/v{major}/internal/version.gitTreeState=clean"]
    for pkg in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X helm.sh/helm/v{major}/{pkg}.k8sVersionMajor=1",
                  f"-X helm.sh/helm/v{major}/{pkg}.k8sVersionMinor={HELM_K8S_MINOR}"]
    return " ".join(flags)


def build() -> Path:
    """Build helm unless cached; return its path."""
    target = helm_path()
    label = f"helm {HELM_VERSION}"
    if target.is_file() and os.access(target, os.X_OK):
        log(f"{label}: cached at {target}")
        return target
    if shutil.which("go") is None:
        raise HelmToolError("`go` is not on PATH")
    check_wrapper_pin()
    with build_lock():
        if target.is_file():  # another process built it while we waited
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        log_path = target.parent / "build.log"
        log(f"{label}: building {HELM_PACKAGE} (log: {log_path})")
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
            built = Path(tmp) / "helm"
            run_with_progress(["go", "build", "-trimpath", f"-ldflags={ldflags()}", "-o", str(built), HELM_PACKAGE],
                              cwd=WRAPPER, env=go_env(mod_mode=True), log_path=log_path, label=label)
            if not built.is_file():
                raise HelmToolError(f"{label}: go produced no binary in {tmp}")
            os.replace(built, target)  # atomic: a half-built binary never counts
        log(f"{label}: built in {fmt_duration(time.monotonic() - start)}")
    return target


def go_mod_download(module: str, version: str) -> dict[str, Any]:
    result = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=go_env(mod_mode=False),
                            capture_output=True, text=True, cwd=tempfile.gettempdir(), check=False)
    if result.returncode != 0:
        raise HelmToolError(f"go mod download {module}@{version} failed: {(result.stdout + result.stderr).strip()}")
    info: dict[str, Any] = json.loads(result.stdout)
    return info


def crd_dir(source: CRDSource) -> Path:
    return cache_root() / "crds" / f"{source.name}-{source.version}"


def fetch_crds(names: Sequence[str] = ()) -> dict[str, Path]:
    """Copy the pinned projects' CRDs into the cache (once); return {project: directory}."""
    unknown = [n for n in names if n not in CRD_SOURCES]
    if unknown:
        raise HelmToolError(f"unknown CRD source(s) {unknown}; known: {list(CRD_SOURCES)}")
    result = {}
    for source in [CRD_SOURCES[n] for n in names] if names else CRD_SOURCES.values():
        target = crd_dir(source)
        if all((target / f).is_file() for f in source.files):
            log(f"{source.name} {source.version} CRDs: cached in {target}")
        else:
            log(f"{source.name} {source.version} CRDs: go mod download {source.module}@{source.version}")
            module_dir = Path(go_mod_download(source.module, source.version)["Dir"]) / source.directory
            target.mkdir(parents=True, exist_ok=True)
            for name in source.files:
                src = module_dir / name
                if not src.is_file():
                    raise HelmToolError(f"{source.module}@{source.version} has no {source.directory}/{name}")
                tmp = target / f".{name}.tmp"
                shutil.copyfile(src, tmp)
                tmp.chmod(0o644)  # the module cache is read-only
                os.replace(tmp, target / name)
            log(f"{source.name} {source.version} CRDs: {len(source.files)} files in {target}")
        result[source.name] = target
    return result


def pin() -> None:
    """Regenerate the wrapper module (go.mod + go.sum via `go mod tidy`) for HELM_VERSION."""
    WRAPPER.mkdir(parents=True, exist_ok=True)
    (WRAPPER / "go.mod").write_text(
        f"module llm-autopilot/hack/tools/helm\n\ngo 1.26.0\n\nrequire {HELM_MODULE} {HELM_VERSION}\n")
    (WRAPPER / "tools.go").write_text(
        "//go:build tools\n\n"
        f"// Package tools pins {HELM_MODULE} {HELM_VERSION} for hack/helm.py.\n"
        f'package tools\n\nimport (\n\t_ "{HELM_PACKAGE}"\n)\n')
    (WRAPPER / "go.sum").unlink(missing_ok=True)
    log(f"go mod tidy in {WRAPPER}")
    subprocess.run(["go", "mod", "tidy"], cwd=WRAPPER, env=go_env(mod_mode=True), check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or reuse) the pinned helm")
    sub.add_parser("path", help="print the helm binary's path, building it first when missing")
    crds = sub.add_parser("crds", help="fetch third-party CRDs (prometheus-operator, cert-manager) into the cache")
    crds.add_argument("sources", nargs="*", help=f"any of {list(CRD_SOURCES)} (default: all)")
    crds.add_argument("--print", action="store_true", help="print every CRD file instead of the directories")
    sub.add_parser("pin", help="regenerate hack/tools/helm/ from HELM_VERSION")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build()
        elif args.command == "path":
            print(build())
        elif args.command == "crds":
            dirs = fetch_crds(args.sources)
            for name, directory in dirs.items():
                if args.print:
                    for f in CRD_SOURCES[name].files:
                        print(directory / f)
                else:
                    print(directory)
        elif args.command == "pin":
            pin()
    except (HelmToolError, ClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
