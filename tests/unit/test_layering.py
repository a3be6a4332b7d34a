"""Functional core, imperative shell: pure modules never import the shells or I/O libraries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "llm_autopilot"
PURE = ["domain", "catalog", "vllm", "planner", "render", "api", "remediation", "desired"]
SHELLS = ("llm_autopilot.hub", "llm_autopilot.cli", "llm_autopilot.controller", "kopf", "kubernetes",
          "huggingface_hub", "prometheus_api_client", "requests", "httpx", "urllib", "socket", "subprocess")
#: Which layers each layer may import (its own and the ones below it).
ALLOWED = {
    "domain": {"domain"},
    "catalog": {"domain", "catalog"},
    "vllm": {"domain", "vllm"},
    "planner": {"domain", "catalog", "vllm", "planner"},
    "api": {"domain", "catalog", "vllm", "planner", "api"},
    "render": {"domain", "catalog", "vllm", "planner", "api", "render"},
    #: decides from gathered evidence (controller/gather.py gathers it)
    "remediation": {"domain", "catalog", "vllm", "planner", "api", "remediation"},
    #: the reconcile's desired state, from the World one gather step read
    "desired": {"domain", "catalog", "vllm", "planner", "api", "render", "remediation", "desired"},
}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", PURE)
def test_pure_layers_import_only_downwards(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert not name.startswith(SHELLS), f"{path.relative_to(PACKAGE)} imports shell {name}"
            if name.startswith("llm_autopilot."):
                target = name.split(".")[1]
                assert target in ALLOWED[layer], f"{path.relative_to(PACKAGE)} ({layer}) imports {name}"


#: pure modules inside a shell package, with the layers each may import
PURE_FILES = {"storage/sigv4.py": set[str](), "api/sources.py": {"api"}}


@pytest.mark.parametrize("module", sorted(PURE_FILES))
def test_pure_modules_in_shell_packages(module: str) -> None:
    for name in _imports(PACKAGE / module):
        assert not name.startswith(SHELLS), f"{module} imports shell {name}"
        if name.startswith("llm_autopilot."):
            assert name.split(".")[1] in PURE_FILES[module], f"{module} imports {name}"


def test_e2e_modules_share_helpers_instead_of_importing_each_other() -> None:
    e2e = PACKAGE.parents[1] / "tests" / "e2e"
    modules = sorted(e2e.glob("test_*.py"))
    assert modules and (e2e / "helpers.py").exists()
    for path in modules:
        for name in _imports(path):
            assert not name.startswith("tests.e2e.test_"), f"{path.name} imports {name}: move it to helpers.py"


DESIRED = PACKAGE / "desired"
SECTIONS = "llm_autopilot.desired.sections"
PIPELINE = "llm_autopilot.desired.pipeline"
#: the modules below the pipeline and the sections: they import neither
BELOW_SECTIONS = ["patch.py", "status_read.py", "status_fields.py", "vocabulary.py", "planning.py", "world.py",
                  "burn_in.py", "calibration.py", "lora_calls.py", "lora_sync.py", "refusals.py", "schedule.py"]


def _desired_imports(path: Path) -> list[str]:
    """The modules of llm_autopilot.desired a file imports (``from llm_autopilot.desired import x`` names x)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("llm_autopilot.desired")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llm_autopilot.desired"):
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("section", sorted(p.name for p in (DESIRED / "sections").glob("*.py")))
def test_a_section_never_imports_another_section_or_the_pipeline(section: str) -> None:
    for name in _desired_imports(DESIRED / "sections" / section):
        assert not name.startswith((SECTIONS, PIPELINE)), f"sections/{section} imports {name}"


@pytest.mark.parametrize("module", BELOW_SECTIONS)
def test_the_vocabulary_and_the_helpers_import_no_section(module: str) -> None:
    for name in _desired_imports(DESIRED / module):
        assert not name.startswith((SECTIONS, PIPELINE)), f"{module} imports {name}"


def test_only_the_pipeline_imports_the_sections() -> None:
    """intent.py, the re-export for the names' old importers, aside."""
    importers = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                 if any(n.startswith(SECTIONS + ".") for n in _desired_imports(path))
                 and path.parent.name != "sections"}
    assert importers <= {"desired/pipeline.py", "desired/intent.py"}, importers


def test_the_vocabulary_is_the_lowest_decision_module() -> None:
    """It imports only the data modules beside it (the World, the calibration sample), nothing that decides."""
    allowed = {"llm_autopilot.desired.calibration", "llm_autopilot.desired.patch", "llm_autopilot.desired.status_read",
               "llm_autopilot.desired.status_fields", "llm_autopilot.desired.world"}
    for name in _desired_imports(DESIRED / "vocabulary.py"):
        assert name.rsplit(".", 1)[0] in allowed or name in allowed, f"vocabulary.py imports {name}"


@pytest.mark.parametrize("module", sorted(p.relative_to(DESIRED).as_posix() for p in DESIRED.rglob("*.py")))
def test_no_module_of_desired_is_over_300_lines(module: str) -> None:
    assert len((DESIRED / module).read_text().splitlines()) <= 300, module
