"""The operator's own metrics on /metrics (prometheus_client), for the chart's ServiceMonitor and alerts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from llm_autopilot.remediation.recovery import Recovery

RECONCILES = Counter("llm_autopilot_reconciles_total", "Reconciles of LLMDeployments by result.", ["result"])
PLANS = Counter("llm_autopilot_plans_total", "Plans by outcome (feasible, infeasible).", ["outcome"])
REMEDIATION_STEPS = Counter("llm_autopilot_remediation_steps_total",
                            "Remediation steps by signal and kind (step, relax, exhausted).", ["signal", "kind"])
ADMISSION = Counter("llm_autopilot_admission_reviews_total", "Admission reviews by verdict.", ["verdict"])
PROMETHEUS_ERRORS = Counter("llm_autopilot_prometheus_query_errors_total", "Failed Prometheus queries.")
PROMETHEUS_QUERIES = Counter("llm_autopilot_prometheus_queries_total", "Prometheus queries sent.")
RESYNCS = Counter("llm_autopilot_resyncs_total", "Resyncs by result: quiet (nothing the reconcile reads changed, "
                  "so nothing was planned, rendered or read) or full.", ["result"])
CHECKED = Gauge("llm_autopilot_llmdeployments_checked", "LLMDeployments reconciled at least once by this process.")
WRITES = Counter("llm_autopilot_kubernetes_writes_total", "Objects written (server-side apply, status patches).")
STEP_RECOVERY_SECONDS = Histogram(
    "llm_autopilot_step_recovery_seconds",
    "Per remediation step: seconds from the step to the first pod of its plan Ready (the pod's Ready condition "
    "time), by signal and whether a Ready pod served the model throughout (a surge) or not.",
    ["signal", "served_throughout"],
    buckets=(10, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600, 900, 1200, 1800, 3600))
PLAN_SECONDS = Histogram("llm_autopilot_plan_duration_seconds", "Time to plan one LLMDeployment.",
                         buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))


def observe_recoveries(recoveries: Iterable[Recovery]) -> None:
    """The steps that recovered, once the status recording them is written (never for a write that failed)."""
    for recovered in recoveries:
        STEP_RECOVERY_SECONDS.labels(recovered.signal, str(recovered.served_throughout).lower()).observe(
            recovered.seconds)


def serve(port: int, addr: str) -> None:
    start_http_server(port, addr=addr)


def _initialise() -> None:
    """Create every series at 0, so increase() and alerts see the first event (a series born at 1 has none)."""
    from llm_autopilot.remediation.classify import Signal  # noqa: PLC0415 - keeps the module import light

    for result in ("ok", "retry", "error"):
        RECONCILES.labels(result)
    for outcome in ("feasible", "infeasible"):
        PLANS.labels(outcome)
    for verdict in ("allowed", "rejected", "unchanged"):
        ADMISSION.labels(verdict)
    for result in ("quiet", "full"):
        RESYNCS.labels(result)
    for signal in Signal:
        for kind in ("step", "exhausted"):
            REMEDIATION_STEPS.labels(signal.value, kind)
        if signal.is_memory:  # the signals a step answers
            for served in ("true", "false"):
                STEP_RECOVERY_SECONDS.labels(signal.value, served)
    REMEDIATION_STEPS.labels("Calm", "relax")


_initialise()
