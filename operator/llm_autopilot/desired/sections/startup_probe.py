"""Section: status.startupProbe -- the probe the plan in force runs with and why -- and the starts observed this
pass for the store (desired/startup_probe.py decides both)."""

from __future__ import annotations

from llm_autopilot.desired.planning import Rendered
from llm_autopilot.desired.startup_probe import STARTUP_PROBE, RecordStarts, observed_starts, status_of
from llm_autopilot.desired.vocabulary import Draft
from llm_autopilot.planner.start_times import known_pods


def report_startup_probe(d: Draft, final: Rendered) -> None:
    """The pin of the plan rendered, and its pods' starts not in the store yet (once its rollout is complete, on
    one node per replica)."""
    if final.startup is None or final.startup_key is None:
        return
    chosen = status_of(final.startup, final.plan_hash, final.startup_key)
    d.put(STARTUP_PROBE, chosen)
    pin = STARTUP_PROBE.wire(chosen)
    kept = d.world.calibration is not None or d.world.calibration_unreadable is not None
    if kept and (d.read.startup_probe is None or d.read.startup_probe.plan_hash != final.plan_hash):
        # a new plan's choice, recorded before the objects that carry it: chosen again after a lost status write,
        # it could come from a store that changed meanwhile (without a store it is always the formula's)
        d.out.startup_pin = pin
    evidence, store = d.world.evidence, d.world.calibration
    if (evidence is None or store is None or evidence.plan_id != final.plan_hash or not evidence.rollout_complete
            or final.nodes != 1):
        return
    new = observed_starts(evidence.pods, final.plan_hash, d.owner.namespace,
                          known_pods(store.starts, final.startup_key))
    if new:
        d.out.effects.append(RecordStarts(final.startup_key, new))
