"""What vLLM's LoRA series says about a KV saturation: which adapters had requests in flight, and whether they
outnumbered the GPU adapter slots. Pure: controller/evidence.py asks :func:`lora_query` and hands the series'
labels to :func:`read_activity`; :func:`with_lora` adds the explanation to the saturation's evidence.

Read in the 0.32.0 and 0.33.0 wheels (``vllm/v1/metrics/stats.py``, ``LoRARequestStates.update_scheduler_stats``;
``vllm/v1/metrics/loggers.py``): vLLM writes every adapter with a request in flight, running or waiting, into
both ``running_lora_adapters`` and ``waiting_lora_adapters`` (the per-adapter counts are dropped when the
labels are joined), so in these releases the two labels are one set. What still tells queueing for a slot
apart: the scheduler never runs requests of more than ``max_loras`` adapters at once
(``vllm/v1/core/sched/scheduler.py`` asserts it), so more adapters in flight than slots means the others'
requests wait for a slot, not only for KV cache. Where the labels differ (a release that fills them apart),
an adapter waiting while ``max_loras`` others run is waiting for a slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_autopilot.remediation.classify import Classification
from llm_autopilot.remediation.text import clean_line
from llm_autopilot.vllm.metrics import LORA_MAX_LABEL, LORA_REQUESTS_INFO, LORA_RUNNING_LABEL, LORA_WAITING_LABEL

#: adapter names shown per list (the rest counted): the explanation goes into an Event and the status history
SHOWN_ADAPTERS = 4
#: an adapter name is a label value from Prometheus: cleaned and cut like any untrusted text
ADAPTER_NAME_LIMIT = 48
#: the evidence key the explanation is stored under
EVIDENCE_KEY = "loraAdapters"


def lora_query(selector: str) -> str:
    """Each pod's newest ``LORA_REQUESTS_INFO`` series (vllm/metrics.py): its value is when vLLM last set it
    (``set_to_current_time``) and every label set it has seen stays exported, so the newest is the current."""
    return f"topk by (namespace, pod) (1, {LORA_REQUESTS_INFO}{{{selector}}})"


@dataclass(frozen=True)
class LoRAActivity:
    """One pod's newest ``LORA_REQUESTS_INFO`` series: the adapters named in each label, and the slots."""

    pod: str
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    #: ``--max-loras``; None when the label is missing or not a whole number
    max_loras: int | None = None

    @property
    def one_set(self) -> bool:
        """Both labels name the same adapters: vLLM 0.32 and 0.33 write every adapter in flight into both."""
        return set(self.running) == set(self.waiting)

    @property
    def in_flight(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.running, *self.waiting)))

    @property
    def waiting_for_a_slot(self) -> int:
        """How many adapters' requests certainly wait for a free slot (0: none known to)."""
        if self.max_loras is None:
            return 0
        if self.one_set:  # at most max_loras adapters run at once: the rest of those in flight wait
            return max(len(self.in_flight) - self.max_loras, 0)
        if len(self.running) < self.max_loras:
            return 0  # a free slot: whatever waits does not wait for one
        return len(set(self.waiting) - set(self.running))


def _names(value: str) -> tuple[str, ...]:
    # vLLM joins the adapter names with "," (an empty label: none); Prometheus may hand anything back
    return tuple(dict.fromkeys(clean_line(name, ADAPTER_NAME_LIMIT) for name in value.split(",") if name.strip()))


def read_activity(labels: Mapping[str, str]) -> LoRAActivity:
    """One series' labels as :class:`LoRAActivity`."""
    slots = labels.get(LORA_MAX_LABEL, "")
    return LoRAActivity(pod=clean_line(labels.get("pod", ""), ADAPTER_NAME_LIMIT),
                        running=_names(labels.get(LORA_RUNNING_LABEL, "")),
                        waiting=_names(labels.get(LORA_WAITING_LABEL, "")),
                        max_loras=int(slots) if slots.isascii() and slots.isdigit() else None)


def _listed(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:SHOWN_ADAPTERS])
    more = len(names) - SHOWN_ADAPTERS
    return f" ({shown}{f' and {more} more' if more > 0 else ''})" if names else ""


def _adapters(count: int) -> str:
    return f"{count} LoRA adapter{'' if count == 1 else 's'}"


def explain(activity: Sequence[LoRAActivity]) -> str | None:
    """The LoRA part of a KV saturation's explanation, for the pod most short of adapter slots (then the one
    with the most adapters in flight, then the first by name); None when no pod has the series (no LoRA, or
    Prometheus had none)."""
    if not activity:
        return None
    # the first name on a tie: Prometheus returns series in no set order, the message must not flap
    pod = min(activity, key=lambda a: (-a.waiting_for_a_slot, -len(a.in_flight), a.pod))
    where = f"on pod {pod.pod}" + (f" (of {len(activity)} with LoRA series)" if len(activity) > 1 else "")
    slots = "max_loras unknown" if pod.max_loras is None else f"max_loras {pod.max_loras}"
    if pod.one_set:
        adapters = pod.in_flight
        said = f"{_adapters(len(adapters))} with requests in flight{_listed(adapters)}, {slots}"
    else:
        said = (f"{_adapters(len(pod.running))} running{_listed(pod.running)}, {len(pod.waiting)} waiting"
                f"{_listed(pod.waiting)}, {slots}")
    blocked = pod.waiting_for_a_slot
    if blocked:
        said += (f": the adapter slots are full, {blocked} adapter{' waits' if blocked == 1 else 's wait'} for one "
                 f"(requests queue for a slot, not only for KV cache)")
    return f"{where}: {said}"


def with_lora(saturation: Classification, activity: Sequence[LoRAActivity]) -> Classification:
    """The saturation with what the LoRA series says added to its summary and evidence; as it was without one."""
    said = explain(activity)
    if said is None:
        return saturation
    return dataclasses.replace(saturation, summary=f"{saturation.summary}; {said}",
                               evidence={**saturation.evidence, EVIDENCE_KEY: said})
