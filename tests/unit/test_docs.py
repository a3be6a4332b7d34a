"""The docs site builds strictly, its generated references are what the code generates, the README stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    """The API page walks the whole CRD: every field is a row of its object's table."""
    from llm_autopilot.api.crd import crd  # noqa: PLC0415

    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    page = docs_reference.api_page()
    tables = dict(re.findall(r"^### `([^`]+)`\n(.*?)(?=^#|\Z)", page, re.MULTILINE | re.DOTALL))
    tables.update(re.findall(r"^## (spec|status)\n(.*?)(?=^#|\Z)", page, re.MULTILINE | re.DOTALL))

    def walk(node: dict[str, Any], path: str) -> int:
        count = 0
        for name, prop in node.get("properties", {}).items():
            assert re.search(rf"^\| \[?`{name}`", tables[path], re.MULTILINE), f"{path}.{name}"
            inner = prop.get("items", prop) if prop.get("type") == "array" else prop
            suffix = "[*]" if prop.get("type") == "array" else ""
            count += 1 + walk(inner, f"{path}.{name}{suffix}")
        return count

    assert walk(root["spec"], "spec") + walk(root["status"], "status") > 200


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
