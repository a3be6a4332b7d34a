"""LoRA adapters at runtime, the shell: its reader -- each Ready pod's /v1/models and the answers vLLM gave the
operator's earlier calls on it -- and its executors: one pod's load and unload calls (their answers kept for the
next pass, which desired() asked for soon), and the answers of pods no longer Ready dropped. Its decision is
desired/sections/lora.py's, the calls and the memory controller/lora_runtime.py's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_autopilot.controller import lora_runtime
from llm_autopilot.desired.lora_calls import LoRAKeep, LoRAPodCalls, LoRAPodsAsk, LoRAReading
from llm_autopilot.render.kubernetes import instance_selector

if TYPE_CHECKING:
    from llm_autopilot.controller.reconcile import Reconciler

logger = logging.getLogger(__name__)


def _read(r: Reconciler, ask: LoRAPodsAsk) -> LoRAReading:
    """The Ready pods as they are before this pass's calls, with what vLLM answered the earlier ones."""
    pods = lora_runtime.ready_pods(r.kube.pods(ask.namespace, instance_selector(ask.name)))
    kept = {p.uid: r.lora_answers.of(r.owner.uid, p.uid) for p in pods if p.uid}
    return LoRAReading(tuple(lora_runtime.read_pods(pods, kept)))


def _call(r: Reconciler, calls: LoRAPodCalls) -> None:
    """One pod's calls; each answer kept under the pod's uid for the next pass."""
    for answer in lora_runtime.call_pod(calls):
        r.lora_answers.record(r.owner.uid, calls.uid, answer)
        said = "done" if answer.ok else answer.text
        logger.info("%s/%s: %s %s on %s: %s", r.owner.namespace, r.owner.name, answer.kind, answer.name, calls.pod,
                    said)


def _keep(r: Reconciler, keep: LoRAKeep) -> None:
    """The answers of the pods no longer read Ready, dropped."""
    r.lora_answers.keep(r.owner.uid, keep.uids)


READERS: dict[type, Callable[[Reconciler, Any], object]] = {LoRAPodsAsk: _read}
EXECUTORS: dict[type, Callable[[Reconciler, Any], None]] = {LoRAPodCalls: _call, LoRAKeep: _keep}
