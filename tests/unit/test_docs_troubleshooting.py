"""docs/troubleshooting.md has one entry per condition and Event reason the code can set, and no other.

The reasons are found by reading the code (an AST scan), not from a list kept by hand: a string constant is a
reason where it is passed in a reason's place (the calls below, ``reason=``, ``reason = ...``), where it sits
in a (status, reason, message) or (Event type, reason, message) triple or a (reason, message) pair, or where it
is a module constant used in one of those places. Remediation's signals are reasons of Degraded
(``signal.signal.value``), and an Event reason built in an f-string is a prefix the entries must extend.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "llm_autopilot"
PAGE = ROOT / "docs" / "troubleshooting.md"
#: where conditions and Events are made
SCANNED = ["api/conditions.py", "desired", "controller", "remediation", "planner/verify.py", "render"]
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
#: a callee's name -> the position of its reason argument
REASON_ARG = {"fail": 0, "Unresolved": 0, "AdapterRefusal": 0, "condition": 2, "ConditionUpdate": 2,
              "set_condition": 3, "event": 1, "Note": 1, "BurnInVerdict": 2}
SEVERITIES = {"Normal", "Warning"}
#: (reason, message) pairs the scan finds that are not reasons, each with why
NOT_REASONS = {
    "Calm": "remediation's (signal, kind) metric labels of a relax step, ('Calm', 'relax'): not a condition",
    "None": "a LeaderWorkerSet's restartPolicy value in render/groups.py",
}
#: reasons Kubernetes sets that the operator passes through (api/conditions.deployment_ready: the ReplicaSet's)
PASSED_THROUGH = {"FailedCreate"}


def _files() -> Iterator[Path]:
    for name in SCANNED:
        path = PACKAGE / name
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def _module_constants() -> dict[str, set[str]]:
    """Every module-level NAME = "Str" (and NAME, OTHER = "A", "B") of the package, by name."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts, strict=False)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                for name, value in pairs:
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.setdefault(name.id, set()).add(value.value)
    return found


def _signals() -> list[str]:
    for node in ast.walk(ast.parse((PACKAGE / "remediation" / "classify.py").read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Signal":
            return [str(n.value.value) for n in node.body
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]
    raise AssertionError("remediation/classify.py has no Signal enum any more: teach this scan where signals are")


def _is_message(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and not CAMEL.match(node.value)
    return isinstance(node, ast.JoinedStr | ast.BinOp) or (isinstance(node, ast.Name) and node.id in ("message", "msg"))


def code_reasons() -> tuple[dict[str, str], set[str]]:
    """Every reason the code can set, with one place that sets it, and the prefixes of f-string reasons."""
    constants, signals = _module_constants(), _signals()
    found: dict[str, str] = {}
    prefixes: set[str] = set()

    def take(node: ast.expr, where: str) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CAMEL.match(node.value):
            found.setdefault(node.value, where)
        elif (isinstance(node, ast.Attribute) and node.attr == "value" and isinstance(node.value, ast.Attribute)
              and node.value.attr == "signal"):
            for signal in signals:
                found.setdefault(signal, where)
        elif isinstance(node, ast.Name | ast.Attribute):
            for value in constants.get(node.id if isinstance(node, ast.Name) else node.attr, ()):
                if CAMEL.match(value):
                    found.setdefault(value, where)
        elif isinstance(node, ast.IfExp):
            take(node.body, where)
            take(node.orelse, where)
        elif isinstance(node, ast.Subscript):
            take(node.value, where)
        elif isinstance(node, ast.Dict):
            for item in node.values:
                if item is not None:
                    take(item, where)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefixes.add(str(node.values[0].value))

    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in REASON_ARG and len(node.args) > REASON_ARG[name]:
                    take(node.args[REASON_ARG[name]], where)
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        take(keyword.value, where)
            elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and (first.value in (True, False, None)
                                                        or first.value in SEVERITIES):
                    take(node.elts[1], where)
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and _is_message(node.elts[1]):
                take(node.elts[0], where)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "reason"
                                                      for t in node.targets):
                take(node.value, where)
    for name in NOT_REASONS:
        found.pop(name, None)
    return found, prefixes


def page_entries() -> list[str]:
    """The reasons the page has an entry for: its ### headings, each a reason in backticks."""
    return re.findall(r"^### `([A-Za-z0-9]+)`$", PAGE.read_text(), re.MULTILINE)


def test_the_scan_finds_reasons_in_every_form() -> None:
    reasons, prefixes = code_reasons()
    # one of each form: fail(), condition(), a (status, reason, message) triple, an Event triple, a (reason,
    # message) pair through a module constant, a signal, an IfExp, a dict of reasons
    for reason in ("Infeasible", "AsPlanned", "NoWorkload", "PlanNotVerified", "SourceNotFound", "KVSaturation",
                   "BurnInFailed", "RemediationDisabled"):
        assert reason in reasons, reason
    # the LoRA Events' reasons are whole in the code (desired/lora_calls.py), no longer an f-string's prefix
    assert {"LoRAAdapterLoaded", "LoRAAdapterUnloaded", "LoRAAdapterFailed"} <= set(reasons)
    assert not prefixes


def test_every_reason_the_code_sets_has_an_entry() -> None:
    reasons, _ = code_reasons()
    entries = set(page_entries())
    missing = {r: where for r, where in reasons.items() if r not in entries}
    assert not missing, f"reasons without an entry in docs/troubleshooting.md (### `Reason`): {missing}"


def test_every_entry_names_a_reason_the_code_can_set() -> None:
    reasons, prefixes = code_reasons()
    entries = page_entries()
    assert len(entries) == len(set(entries)), "an entry is there twice"
    unknown = [e for e in entries if e not in reasons and e not in PASSED_THROUGH
               and not any(e.startswith(p) and CAMEL.match(e[len(p):]) for p in prefixes)]
    assert not unknown, f"entries for reasons the code cannot set: {unknown}"
