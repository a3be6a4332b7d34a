"""Every LLMDeployment manifest in docs/ and examples/ goes through the local API server and the webhook.

A server-side dry run (`kubectl apply --dry-run=server`) in a namespace the session operator's webhook
validates: a manifest is admitted, unless the docs show it refused: a `console` block right after its YAML
block (or after `kubectl apply -f examples/NAME.yaml` for an example) that says `denied the request: MESSAGE`.
Then it must be refused with MESSAGE (`...` in it stands for any text). Fragments without `kind:
LLMDeployment` and an `apiVersion` are not manifests; `metadata.namespace` is dropped (the test's namespace).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Kubectl, Operator

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
DENIED = "denied the request:"


@dataclass(frozen=True)
class Manifest:
    where: str
    body: dict[str, Any]
    refused_with: str | None


def _manifest(text: str) -> dict[str, Any] | None:
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if isinstance(body, dict) and body.get("kind") == "LLMDeployment" and body.get("apiVersion"):
        return body
    return None


def _refusal(console: str) -> str:
    return " ".join(console.split(DENIED, 1)[1].split())


def manifests() -> list[Manifest]:
    found: list[Manifest] = []
    example_refusals: dict[str, str] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        blocks = list(BLOCK.finditer(text))
        for index, block in enumerate(blocks):
            language, content = block.group(1), block.group(2)
            if language == "console" and DENIED in content:
                applied = re.search(r"kubectl apply -f (examples/[\w.-]+\.yaml)", content)
                if applied:
                    example_refusals[applied.group(1)] = _refusal(content)
            body = _manifest(content) if language == "yaml" else None
            if body is None:
                continue
            after = blocks[index + 1] if index + 1 < len(blocks) else None
            between = text[block.end():after.start()] if after else ""
            refused = (_refusal(after.group(2)) if after and after.group(1) == "console"
                       and DENIED in after.group(2) and len(between.strip().splitlines()) <= 2 else None)
            line = text[:block.start()].count("\n") + 1
            found.append(Manifest(f"{page.relative_to(ROOT)}:{line}", body, refused))
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if isinstance(body, dict) and body.get("kind") == "LLMDeployment":
                name = str(path.relative_to(ROOT))
                found.append(Manifest(name, body, example_refusals.get(name)))
    return found


def _matches(shown: str, message: str) -> bool:
    """The shown message's parts, split at `...`, appear in the real one in order."""
    position, text = 0, " ".join(message.split())
    for part in (p.strip() for p in shown.split("...")):
        found = text.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return True


def test_the_docs_and_examples_hold_manifests() -> None:
    found = manifests()
    assert len([m for m in found if m.where.startswith("examples/")]) >= 10
    assert any(m.refused_with for m in found), "no manifest shown refused: the convention is lost"


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: m.where)
def test_a_documented_manifest_is_admitted_or_refused_as_the_page_shows(
        manifest: Manifest, kubectl: Kubectl, operator: Operator, namespace: str) -> None:
    body = dict(manifest.body)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "namespace"}
    result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(body),
                     check=False)
    if manifest.refused_with is None:
        assert result.returncode == 0, f"{manifest.where} is refused, and no page shows it refused:\n{result.stderr}"
    else:
        assert result.returncode != 0, f"{manifest.where} is admitted, but the page shows it refused"
        assert DENIED in result.stderr, result.stderr
        assert _matches(manifest.refused_with, result.stderr.split(DENIED, 1)[1]), (
            f"{manifest.where} is refused with another message than the page shows:\n{result.stderr}")
