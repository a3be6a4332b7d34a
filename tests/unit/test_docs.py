"""The docs site builds strictly, its generated references are what the code generates, the README stays short."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_autopilot import docs_reference

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """No broken link or anchor, no page outside the navigation (mkdocs.yml's validation: warn + --strict)."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail(f"{mkdocs} is missing: `make install` installs the dev extra, mkdocs with it")
    result = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "troubleshooting" / "index.html").exists()


@pytest.mark.parametrize("page", sorted(docs_reference.PAGES))
def test_the_reference_page_is_what_the_code_generates(page: str) -> None:
    written = (ROOT / "docs" / "reference" / page).read_text()
    assert written == docs_reference.PAGES[page](), f"docs/reference/{page} is stale: run `make reference`"


def test_every_api_field_is_in_the_reference() -> None:
    """The API page walks the whole CRD: a field of the spec the models generate is a row."""
    from llm_autopilot.api.crd import crd  # noqa: PLC0415

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    page = docs_reference.api_page()
    for name in spec["properties"]:
        assert f"| `spec.{name}`" in page
    assert "| `spec.vllm.reasoningParser` |" in page


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
