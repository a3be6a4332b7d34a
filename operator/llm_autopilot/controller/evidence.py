"""Shell: remediation's evidence on one LLMDeployment -- its pods' terminations, the previous container's log
and Prometheus' saturation rule; remediation/decide.py decides on it, without I/O.

Every read is narrow and bounded: the pods of one deployment (from the pod watch in the operator), the last
lines of one previous log (read once per crash), the saturation rule's instant queries with a timeout (in the
operator asked once per namespace and round, see metrics.SaturationRounds). A log that cannot be read (403
without ``pods/log``, no previous container, the kubelet gone, a timeout; a simulated node) is not an error:
the evidence falls back to the termination message and says so.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from llm_autopilot.controller.kube import LogUnavailable
from llm_autopilot.controller.metrics import (
    MetricsSource,
    MetricsUnavailable,
    PerObjectSaturation,
    QueryRejected,
    SaturationSource,
)
from llm_autopilot.controller.pod_reads import LabelSource, PodReader, PodSource
from llm_autopilot.desired.world import Target
from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.decide import Evidence, Metrics
from llm_autopilot.remediation.evidence import (
    LOG_LIMIT_BYTES,
    LOG_TAIL_LINES,
    Crash,
    LogRead,
    Termination,
    classify_crash,
    latest_termination,
    rollout_complete,
)
from llm_autopilot.remediation.lora_slots import LoRAActivity, lora_query, read_activity, with_lora
from llm_autopilot.remediation.recovery import pod_readiness
from llm_autopilot.remediation.saturation import KV_SATURATION, SaturationRule, pod_selector
from llm_autopilot.render.kubernetes import CONTAINER, PLAN_HASH, instance_selector

#: crashes whose log was read, per process (a resync must not read a log twice)
REMEMBERED_CRASHES = 512


class Gatherer(PodReader):
    """The pods' own figures (PodReader) and remediation's evidence. ``metrics`` is asked per object (tools,
    tests); the operator gives ``saturation``, which batches."""

    def __init__(self, pods: PodSource, metrics: MetricsSource | None = None, *,
                 saturation: SaturationSource | None = None, rule: SaturationRule = KV_SATURATION,
                 remembered: int = REMEMBERED_CRASHES, labels: LabelSource | None = None,
                 versions: Callable[[str], str | None] | None = None) -> None:
        super().__init__(pods, labels=labels, versions=versions)
        self.saturation = saturation or (PerObjectSaturation(metrics, rule) if metrics is not None else None)
        self.rule = rule
        self._crashes: OrderedDict[tuple[str, str], Crash] = OrderedDict()
        self._remembered = remembered

    def kv_saturation(self, namespace: str, pods: list[str], *, window: int,
                      threshold: float) -> tuple[Metrics, str, Classification | None]:
        """What Prometheus says about these pods: (availability, where or why not, the signal if any)."""
        if self.saturation is None:
            return Metrics.NOT_CONFIGURED, "", None
        if not pods:  # nothing to ask about: Prometheus said nothing, so MetricsAvailable keeps what it says
            return Metrics.NOT_ASKED, "", None
        try:
            found = self.saturation.saturation(namespace, pods, window=window, threshold=threshold)
        except QueryRejected as exc:
            return Metrics.REJECTED, str(exc), None
        except MetricsUnavailable as exc:
            return Metrics.UNAVAILABLE, str(exc), None
        return Metrics.AVAILABLE, self.saturation.where, found

    def gather(self, target: Target) -> Evidence:
        pods = self.pods.pods(target.namespace, instance_selector(target.name))
        current = [str(p["metadata"]["name"]) for p in pods
                   if ((p.get("metadata") or {}).get("annotations") or {}).get(PLAN_HASH) == target.plan_hash]
        rollout = rollout_complete(target.deployment, plan_hash=target.plan_hash, plan_hash_annotation=PLAN_HASH,
                                   replicas=target.replicas)
        readiness = tuple(pod_readiness(p, PLAN_HASH, CONTAINER) for p in pods)
        metrics, detail, saturation = self.kv_saturation(target.namespace, current, window=target.kv_window,
                                                         threshold=target.kv_threshold)
        if metrics in (Metrics.UNAVAILABLE, Metrics.REJECTED):
            return Evidence(None, None, metrics, detail, rollout, target.plan_hash, pods=readiness)
        if saturation is not None and target.lora:
            saturation = with_lora(saturation, self.lora_activity(target.namespace, current))
        termination = latest_termination(pods, container=CONTAINER, plan_hash=target.plan_hash,
                                         plan_hash_annotation=PLAN_HASH)
        crash = self._crash(target, termination) if termination is not None else None
        return Evidence(crash, saturation, metrics, detail, rollout, target.plan_hash, pods=readiness)

    def lora_activity(self, namespace: str, pods: list[str]) -> tuple[LoRAActivity, ...]:
        """Each pod's newest LORA_REQUESTS_INFO series (one instant query for all). Never raises: Prometheus
        down or no series is no activity, and the saturation evidence stays as the rule gave it."""
        if self.labels is None or not pods:
            return ()
        try:
            found = self.labels.series(lora_query(pod_selector(namespace, pods)))
        except MetricsUnavailable:
            return ()
        return tuple(read_activity(labels) for labels in found)


    def _crash(self, target: Target, t: Termination) -> Crash:
        if t.key == target.last_evidence or not t.needs_log:
            return classify_crash(t)  # already acted on, or the pod status says all
        seen = (target.namespace, t.key)
        if seen in self._crashes:
            self._crashes.move_to_end(seen)
            return self._crashes[seen]
        try:
            log = LogRead(text=self.pods.previous_log(target.namespace, t.pod, CONTAINER, tail_lines=LOG_TAIL_LINES,
                                                      limit_bytes=LOG_LIMIT_BYTES))
        except LogUnavailable as exc:
            log = LogRead(unavailable=str(exc))
        except Exception as exc:  # best-effort evidence: any other failure falls back the same way
            log = LogRead(unavailable=f"{type(exc).__name__}: {exc}")
        crash = classify_crash(t, log)
        self._crashes[seen] = crash
        while len(self._crashes) > self._remembered:
            self._crashes.popitem(last=False)
        return crash
