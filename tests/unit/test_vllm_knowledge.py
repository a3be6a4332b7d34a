"""What the operator knows about vLLM lives in vllm/: the series names each release exposes (vllm/metrics.py),
which everything that reads vLLM's series uses -- the chart's alert rules and dashboard (checked here, name by
name), the saturation rule, the KEDA triggers, the simulator; the error messages (vllm/errors.py); the default
release, which the flag table (vllm/data/flags.json) must hold."""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hack import vllm_sim

from llm_autopilot.remediation.saturation import KV_SATURATION, USAGE_METRICS
from llm_autopilot.render.autoscaling import kv_usage_query, waiting_query
from llm_autopilot.render.kubernetes import Owner
from llm_autopilot.vllm import errors
from llm_autopilot.vllm.flags import examined_versions, known_flags
from llm_autopilot.vllm.metrics import (
    KNOWN_NAMES,
    KV_CACHE_USAGE_NAMES,
    LORA_MAX_LABEL,
    LORA_REQUESTS_INFO,
    LORA_RUNNING_LABEL,
    LORA_WAITING_LABEL,
    TABLE,
    Metric,
    every_name,
    names,
)
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION, VLLMVersion

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "llm_autopilot"
CHART = ROOT / "charts" / "llm-autopilot"
RULES = CHART / "templates" / "prometheusrule.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
#: a vLLM series name in PromQL or prose (``vllm:`` as a YAML key, followed by a newline, is not one)
SERIES = re.compile(r"\bvllm:[A-Za-z_][A-Za-z0-9_:]*")

OLD, NEW = "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"


@pytest.mark.parametrize(("version", "hidden", "expected"), [
    ("0.9.1", False, [OLD]),  # 0.9.1 source: no kv_cache_usage_perc in either engine
    ("0.9.2", False, [NEW, OLD]),  # "Deprecated in 0.9.2 - Renamed as vllm:kv_cache_usage_perc"
    ("0.10.2", False, [NEW, OLD]),
    ("0.11.0", False, [NEW]),  # the old name only with --show-hidden-metrics-for-version=0.10
    ("0.11.0", True, [NEW, OLD]),
    ("0.12.0", True, [NEW]),  # gone
    ("0.33.0", False, [NEW]),
])
def test_kv_cache_usage_names_by_release(version: str, hidden: bool, expected: list[str]) -> None:
    assert names(Metric.KV_CACHE_USAGE, VLLMVersion.parse(version), show_hidden_metrics=hidden) == expected


def test_every_metric_has_a_name_in_every_release_we_plan_for() -> None:
    assert {row.metric for row in TABLE} == set(Metric)
    for version in [VLLMVersion(0, 9, 1), *examined_versions(), DEFAULT_VLLM_VERSION]:
        for metric in Metric:
            assert names(metric, version), f"vLLM {version} exposes no name for {metric}"
    assert len(KNOWN_NAMES) == len(TABLE), "a name is listed twice"


# ---- the chart ----------------------------------------------------------------------------------------------

def _chart_files() -> list[Path]:
    return sorted(p for p in CHART.rglob("*") if p.is_file() and p.suffix in {".yaml", ".json", ".tpl", ".txt", ".md"})


def test_every_vllm_series_the_chart_names_is_in_the_table() -> None:
    found = {(str(p.relative_to(CHART)), name) for p in _chart_files() for name in SERIES.findall(p.read_text())}
    assert {path for path, _ in found} >= {"templates/prometheusrule.yaml", "files/dashboard.json"}
    unknown = sorted(f"{path}: {name}" for path, name in found if name not in KNOWN_NAMES)
    assert not unknown, f"vLLM series the chart reads that vllm/metrics.py does not know: {unknown}"


def _expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from _expressions(value)


def _chart_queries() -> list[str]:
    """The dashboard's target expressions and each alert of the rules template (Helm: not YAML yet)."""
    alerts = re.split(r"^\s*- alert:", RULES.read_text(), flags=re.MULTILINE)[1:]
    return [*_expressions(json.loads(DASHBOARD.read_text())), *alerts]


def test_the_chart_reads_each_metric_under_every_name_a_release_used() -> None:
    """A fleet mixes releases: a query reading one name of a metric must read all of them (the KV-cache usage
    gauge has two)."""
    queries = _chart_queries()
    reading_usage = [q for q in queries if set(SERIES.findall(q)) & set(KV_CACHE_USAGE_NAMES)]
    assert len(reading_usage) >= 2, "the alert and the dashboard both read KV-cache usage"
    for metric in Metric:
        every = set(every_name(metric))
        for query in queries:
            used = set(SERIES.findall(query))
            assert not used & every or every <= used, f"{metric}: {sorted(every - used)} missing from {query}"


def test_the_dashboard_shows_the_lora_adapters_running_and_waiting() -> None:
    """vllm:lora_requests_info's newest series per pod, with its labels as vLLM names them (vllm/metrics.py)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    lora = [p for p in panels if any(LORA_REQUESTS_INFO in q for q in _expressions(p))]
    assert len(lora) == 1, [p["title"] for p in panels]
    (query,) = list(_expressions(lora[0]))
    assert query.startswith("topk by (namespace, llmdeployment, pod) (1, ") and SERIES.findall(query) == [
        LORA_REQUESTS_INFO]
    shown = lora[0]["transformations"][0]["options"]["includeByName"]
    assert {LORA_RUNNING_LABEL, LORA_WAITING_LABEL, LORA_MAX_LABEL} <= set(shown), shown


# ---- the operator and the simulator -------------------------------------------------------------------------

def test_the_saturation_rule_and_the_triggers_read_every_usage_name() -> None:
    assert every_name(Metric.KV_CACHE_USAGE) == USAGE_METRICS
    queries = KV_SATURATION.queries('namespace="ns"', window=120, threshold=0.9)
    used = {name for q in queries.values() for name in SERIES.findall(q)}
    assert used <= KNOWN_NAMES
    assert set(KV_CACHE_USAGE_NAMES) <= used
    owner = Owner("x", "ns", "uid")
    assert set(SERIES.findall(kv_usage_query(owner))) == set(KV_CACHE_USAGE_NAMES)
    assert set(SERIES.findall(waiting_query(owner))) == set(every_name(Metric.REQUESTS_WAITING))


@pytest.mark.parametrize("version", ["0.9.1", "0.10.2", "0.11.0", "0.12.0", str(DEFAULT_VLLM_VERSION)])
@pytest.mark.parametrize("hidden", [False, True])
def test_the_simulator_exposes_what_the_release_does(version: str, hidden: bool) -> None:
    pod = vllm_sim.PodMetrics("ns", "p", "m", vllm_version=version, show_hidden_metrics=hidden)
    exposed = {line.split("{")[0] for line in vllm_sim.render_metrics(pod).splitlines() if not line.startswith("#")}
    v = VLLMVersion.parse(version)
    # the simulator plays a vLLM without LoRA adapters
    expected = {n for m in Metric if m is not Metric.LORA_REQUESTS_INFO
                for n in names(m, v, show_hidden_metrics=hidden)}
    assert exposed - {"vllm:num_preemptions_created"} == expected


def test_the_simulator_defaults_to_the_operators_vllm_version() -> None:
    assert str(DEFAULT_VLLM_VERSION) == vllm_sim.DEFAULT_VLLM_VERSION
    assert vllm_sim.PodMetrics("ns", "p", "m").vllm_version == str(DEFAULT_VLLM_VERSION)


# ---- one place --------------------------------------------------------------------------------------------

def _strings(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


@pytest.mark.parametrize("layer", ["remediation", "render", "planner", "controller"])
def test_no_vllm_series_name_outside_the_table(layer: str) -> None:
    found = [f"{p.relative_to(PACKAGE)}:{line}: {name}" for p in sorted((PACKAGE / layer).rglob("*.py"))
             for line, text in _strings(p) for name in SERIES.findall(text)]
    assert not found, f"spell vLLM's series with llm_autopilot.vllm.metrics: {found}"


def test_no_vllm_error_message_outside_vllm_errors() -> None:
    """A pattern as a literal of its own, or a sentence of vLLM's inside one (remediation's summaries say
    "CUDA out of memory while serving" in their own words)."""
    messages = [errors.KV_NEEDED, errors.OLD_KV_CAPACITY, errors.NO_CACHE_BLOCKS, errors.CPU_NO_KV_MEMORY,
                errors.SERVING, errors.ENGINE_DEAD, *errors.CUDA_OOM, *errors.STARTUP_MARKERS]
    assert all(messages)
    found = [f"{p.relative_to(PACKAGE)}:{line}: {m!r}" for p in sorted((PACKAGE / "remediation").rglob("*.py"))
             for line, text in _strings(p) for m in messages if text == m or (len(m) >= 30 and m in text)]
    assert not found, f"vLLM's messages belong in vllm/errors.py: {found}"


def test_the_default_release_is_one_the_flag_table_read() -> None:
    """Its flags are read from that release, not taken from an older one."""
    assert DEFAULT_VLLM_VERSION in examined_versions()
    assert known_flags(DEFAULT_VLLM_VERSION)


def test_the_simulators_vllm_modules_need_only_the_standard_library() -> None:
    """hack/vllm_sim.py runs as a plain script too: what it imports from the package (and what that imports)
    must not need the venv."""
    todo, seen = ["llm_autopilot.vllm.metrics", "llm_autopilot.vllm.versions"], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in imported:
                if name.startswith("llm_autopilot."):
                    todo.append(name)
                else:
                    assert name.split(".")[0] in sys.stdlib_module_names, f"{module} imports {name}"
    assert "llm_autopilot.domain.gpu" in seen
