"""Building the control plane's Go binaries from pinned upstream modules, cached under ``<cache>/bin/``.

``pin`` regenerates the wrapper modules in ``hack/tools/`` (their go.mod/go.sum) after a version bump.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .paths import HACK_DIR, ClusterError, cache_root, fmt_duration, log

TOOLS_DIR = HACK_DIR / "tools"


# --------------------------------------------------------------------------
# Pinned versions. After changing one, run `cluster.py pin`: it rewrites the
# wrapper go.mod/go.sum under hack/tools/ (commit them).
# --------------------------------------------------------------------------
K8S_VERSION = "v1.37.2"  # k8s.io/kubernetes; staging modules at v0.37.2
ETCD_VERSION = "v3.6.16"  # go.etcd.io/etcd/server/v3
KWOK_VERSION = "v0.8.0"  # sigs.k8s.io/kwok
KSM_VERSION = "v2.20.0"  # k8s.io/kube-state-metrics/v2
KEDA_VERSION = "v2.21.0"  # github.com/kedacore/keda/v2 (operator and metrics API server)
KEDA_MODULE = "github.com/kedacore/keda/v2"
# SeaweedFS (the S3-compatible store, Apache-2.0) publishes no tagged Go module versions; this is the pseudo-version
# the module proxy serves. Its go.mod says `go 1.26.6` and replaces a module, which the wrapper repeats.
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
# KEDA's go.mod replaces this module (a licence fix); a `replace` binds only the main module, so the wrapper
# repeats it (`pin` copies every replace of KEDA's go.mod).


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


def keda_version_ldflags(version: str) -> list[str]:
    return [f"-X {KEDA_MODULE}/version.Version={version.lstrip('v')}", f"-X {KEDA_MODULE}/version.GitCommit={version}"]


def seaweedfs_version_ldflags(version: str) -> list[str]:
    return [f"-X {SEAWEEDFS_MODULE}/weed/util/version.COMMIT={version.rsplit('-', 1)[-1]}"]


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
        Binary(
            name="keda-operator",
            version=KEDA_VERSION,
            package=f"{KEDA_MODULE}/cmd/operator",
            pin_module=KEDA_MODULE,
            wrapper="keda",
            ldflags=keda_version_ldflags,
        ),
        Binary(
            name="keda-adapter",
            version=KEDA_VERSION,
            package=f"{KEDA_MODULE}/cmd/adapter",
            pin_module=KEDA_MODULE,
            wrapper="keda",
            ldflags=keda_version_ldflags,
        ),
        Binary(
            name="seaweedfs",  # the `weed` command: master, volume server, filer and S3 gateway in one binary
            version=SEAWEEDFS_VERSION,
            package=f"{SEAWEEDFS_MODULE}/weed",
            pin_module=SEAWEEDFS_MODULE,
            wrapper="seaweedfs",
            ldflags=seaweedfs_version_ldflags,
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
    go_version: str = "1.26.0",
) -> None:
    """Write hack/tools/<name>/{go.mod,tools.go} and resolve go.sum with `go mod tidy`.

    A ``replaces`` value is a version (the same module at that version) or ``"other/module version"``."""
    wrapper = TOOLS_DIR / name
    wrapper.mkdir(parents=True, exist_ok=True)
    lines = [f"module llm-autopilot/hack/tools/{name}", "", f"go {go_version}", ""]
    lines += [*godebug, ""] if godebug else []
    lines += ["require ("] + [f"\t{m} {v}" for m, v in requires.items()] + [")", ""]
    if replaces:
        lines += ["replace ("] + [f"\t{m} => {v if ' ' in v else f'{m} {v}'}" for m, v in replaces.items()] + [")"]
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
    keda = go_mod_download(KEDA_MODULE, KEDA_VERSION)
    write_wrapper(
        "keda",
        {KEDA_MODULE: KEDA_VERSION},
        dict(re.findall(r"^replace (\S+) \S+ => \S+ (\S+)$", Path(keda["GoMod"]).read_text(), re.M)),
        [BINARIES[n].package for n in ("keda-adapter", "keda-operator")],
        f"pins {KEDA_MODULE} {KEDA_VERSION} for hack/cluster.py. KEDA's go.mod\n"
        "// replaces some modules, which only its main module sees, so the wrapper repeats them.",
    )
    seaweedfs = go_mod_download(SEAWEEDFS_MODULE, SEAWEEDFS_VERSION)
    seaweedfs_mod = Path(seaweedfs["GoMod"]).read_text()
    write_wrapper(
        "seaweedfs",
        {SEAWEEDFS_MODULE: SEAWEEDFS_VERSION},
        dict(re.findall(r"^replace (\S+) => (\S+ \S+)$", seaweedfs_mod, re.M)),
        [BINARIES["seaweedfs"].package],
        f"pins {SEAWEEDFS_MODULE} {SEAWEEDFS_VERSION} for hack/cluster.py.\n"
        "// SeaweedFS's go.mod replaces some modules, which only its main module sees, so the wrapper repeats them.",
        go_version=re.search(r"^go (\S+)$", seaweedfs_mod, re.M).group(1),  # type: ignore[union-attr]
    )
