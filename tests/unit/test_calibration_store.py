"""The KV calibration store in the cluster (issue #18, item 2): the shell that reads and writes the ConfigMap
(controller/calibration_store.py), and what reconciles take from it (desired/calibration.py): a deployment's
verified figures become a sample, a later deployment on the same GPU, vLLM version and family plans with it, and
the one measured first never rolls for it."""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from llm_autopilot.controller.calibration_store import CONFIGMAP_NAME, KEY_ENV, CalibrationBook
from llm_autopilot.controller.gather import Gatherer
from llm_autopilot.controller.kube import WriteConflict
from llm_autopilot.desired.calibration import PLANNED_BEFORE, Calibrations, SampleToRecord
from llm_autopilot.planner.calibration import CONFIGMAP_KEY, CalibrationKey, Sample, sample_attestation
from tests.unit.fakes import NAMESPACE, FakeCluster, Run

NOW = datetime(2031, 5, 17, 8, 30, tzinfo=UTC)
KEY = CalibrationKey("H100-80GB", "0.33.0", "qwen3")
OPERATOR_NS = "llm-autopilot"
#: the operator's attestation key (the chart's Secret): every replica has the same
SECRET = "k" * 32


@pytest.fixture(autouse=True)
def attestation_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)


def attested(raw: dict[str, Any], key: CalibrationKey = KEY) -> dict[str, Any]:
    """A sample as another replica of the operator writes it: with its attestation."""
    sample = Sample(float(raw["ratio"]), datetime.fromisoformat(raw["time"]), raw["deployment"])
    return {**raw, "attestation": sample_attestation(SECRET.encode(), key, sample)}


@dataclass
class ConfigMaps:
    """ConfigMaps as the API server keeps them: a resourceVersion per write, 409 on a stale one."""

    items: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0
    #: data another writer puts in just before each of the next writes (a race)
    races: list[dict[str, str]] = field(default_factory=list)
    version: int = 0

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        found = self.items.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def put(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.version += 1
        self.items[(namespace, name)] = {"metadata": {"name": name, "namespace": namespace,
                                                      "resourceVersion": str(self.version)}, "data": data}

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], *, resource_version: str | None,
                         labels: dict[str, str], annotations: dict[str, str]) -> None:
        if self.races:
            self.put(namespace, name, self.races.pop(0))
        live = self.items.get((namespace, name))
        if (live is None) != (resource_version is None) or (
                live is not None and live["metadata"]["resourceVersion"] != resource_version):
            raise WriteConflict("409 Conflict: the object has been modified")
        self.put(namespace, name, data)
        self.items[(namespace, name)]["metadata"].update(labels=labels, annotations=annotations)

    def store(self) -> dict[str, Any]:
        return dict(json.loads(self.items[(OPERATOR_NS, CONFIGMAP_NAME)]["data"][CONFIGMAP_KEY]))


def sample(ratio: float, deployment: str, age: timedelta = timedelta(0)) -> SampleToRecord:
    return SampleToRecord(KEY, Sample(ratio, NOW - age, deployment))


def entry_ratios(maps: ConfigMaps) -> dict[str, float]:
    return {s["deployment"]: s["ratio"] for e in maps.store()["entries"] for s in e["samples"]}


def test_the_first_sample_creates_the_configmap_and_the_next_replaces_it() -> None:
    maps = ConfigMaps()
    book = CalibrationBook(maps, OPERATOR_NS)
    assert book.record(sample(0.97, "a/x"), NOW) and book.record(sample(0.96, "b/y"), NOW)
    assert entry_ratios(maps) == {"a/x": 0.97, "b/y": 0.96}
    assert book.record(sample(0.98, "a/x"), NOW)  # one sample per deployment: its newest
    assert entry_ratios(maps) == {"a/x": 0.98, "b/y": 0.96} and book.writes == 3


def test_a_concurrent_writer_loses_nothing() -> None:
    theirs = {CONFIGMAP_KEY: json.dumps({"version": 1, "entries": [
        {"gpuProduct": KEY.gpu_product, "vllmVersion": KEY.vllm_version, "family": KEY.family,
         "samples": [attested({"ratio": 0.95, "time": NOW.isoformat(), "deployment": "c/z"})]}]})}
    maps = ConfigMaps(races=[theirs])
    book = CalibrationBook(maps, OPERATOR_NS)
    assert book.record(sample(0.97, "a/x"), NOW)
    # the first write met the other writer's ConfigMap (409): read again, this sample added to theirs
    assert entry_ratios(maps) == {"c/z": 0.95, "a/x": 0.97}


def test_a_store_it_may_not_write_is_said_and_the_reconcile_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class Forbidden(ConfigMaps):
        def write_config_map(self, namespace: str, name: str, data: dict[str, str], *, resource_version: str | None,
                             labels: dict[str, str], annotations: dict[str, str]) -> None:
            raise RuntimeError('(403) configmaps is forbidden: User "system:serviceaccount:x:y" cannot create')

    book = CalibrationBook(Forbidden(), OPERATOR_NS)
    with caplog.at_level(logging.WARNING):
        assert not book.record(sample(0.97, "a/x"), NOW) and not book.record(sample(0.97, "a/x"), NOW)
    assert caplog.text.count("cannot write llm-autopilot/llm-autopilot-calibration: (403)") == 1


def test_a_broken_measurement_is_not_written() -> None:
    maps = ConfigMaps()
    book = CalibrationBook(maps, OPERATOR_NS)
    assert not book.record(sample(40.0, "a/x"), NOW) and not maps.items


@pytest.mark.parametrize("data", ["{not json", json.dumps({"version": 2, "entries": []})],
                         ids=["not JSON", "another format version"])
def test_a_store_that_cannot_be_read_calibrates_nothing_and_is_never_overwritten(
        data: str, caplog: pytest.LogCaptureFixture) -> None:
    maps = ConfigMaps()
    maps.put(OPERATOR_NS, CONFIGMAP_NAME, {CONFIGMAP_KEY: data})
    book = CalibrationBook(maps, OPERATOR_NS)
    with caplog.at_level(logging.WARNING):
        store, problem = book.current(NOW)
        assert store is None and problem is not None and "fix or delete the ConfigMap" in problem
        assert not book.record(sample(0.97, "a/x"), NOW)
    assert maps.items[(OPERATOR_NS, CONFIGMAP_NAME)]["data"][CONFIGMAP_KEY] == data
    assert "fix or delete the ConfigMap" in caplog.text


def test_a_forged_entry_is_dropped_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    forged = {"version": 1, "entries": [
        {"gpuProduct": KEY.gpu_product, "vllmVersion": KEY.vllm_version, "family": KEY.family, "samples": [
            {"ratio": 40, "time": NOW.isoformat(), "deployment": "evil/x"},
            {"ratio": 0.9, "time": (NOW + timedelta(days=30)).isoformat(), "deployment": "evil/y"},
            attested({"ratio": 0.97, "time": NOW.isoformat(), "deployment": "a/x"})]}]}
    maps = ConfigMaps()
    maps.put(OPERATOR_NS, CONFIGMAP_NAME, {CONFIGMAP_KEY: json.dumps(forged)})
    clock = [0.0]
    book = CalibrationBook(maps, OPERATOR_NS, ttl_seconds=60, clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING):
        store, _ = book.current(NOW)
        clock[0] = 61
        book.current(NOW)
    assert store is not None and [s.deployment for s in store.entries[KEY]] == ["a/x"]
    assert caplog.text.count("dropped: ratio must be") == 1 and caplog.text.count("in the future") == 1


def test_read_once_per_ttl_and_its_own_write_is_seen_at_once() -> None:
    maps = ConfigMaps()
    clock = [0.0]
    book = CalibrationBook(maps, OPERATOR_NS, ttl_seconds=60, clock=lambda: clock[0])
    book.current(NOW)
    book.current(NOW)
    assert maps.reads == 1
    book.record(sample(0.97, "a/x"), NOW)
    reads = maps.reads
    assert [s.ratio for s in book.current(NOW)[0].entries[KEY]] == [0.97] and maps.reads == reads
    maps.put(OPERATOR_NS, CONFIGMAP_NAME, {CONFIGMAP_KEY: json.dumps({"version": 1, "entries": []})})  # by hand
    clock[0] = 30
    assert KEY in book.current(NOW)[0].entries  # still the copy read within the TTL
    clock[0] = 61
    assert book.current(NOW)[0].entries == {}


# ---- through the reconcile ----------------------------------------------------------------------------------

H100_QWEN = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"},
             "serving": {"maxModelLen": 16384, "minMaxModelLen": 4096}}


def ready_pod(name: str, plan_hash: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"llm-autopilot.io/plan-hash": plan_hash}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def serve(run: Run, tokens: int, pod: str = "x-1") -> None:
    """A Ready pod of the plan whose log says vLLM's KV cache holds ``tokens``."""
    run.cluster.pod_list = [ready_pod(pod, run.cluster.plan_hash(run.name))]
    run.cluster.current_logs[pod] = f"INFO GPU KV cache size: {tokens:,} tokens, Maximum concurrency ..."


def deployment_args(run: Run) -> list[str]:
    return list(run.cluster.deployment(run.name)["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_verified_deployment_calibrates_the_next_one_and_is_not_rolled_by_it() -> None:
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    first = Run(H100_QWEN, calibration=book, name="first", uid="uid-first", cluster=FakeCluster())
    first.once()
    assert "ratio" not in first.status["kvCalibration"]
    assert first.status["kvCalibration"]["message"].startswith("not calibrated: no recent deployment measured")
    predicted = first.status["plan"]["memory"]["kvCacheTokens"]
    args_before = deployment_args(first)
    serve(first, round(predicted * 0.97))  # vLLM has 3 % less room than planned
    first.once()
    measured = first.status["verification"]
    assert measured["errorPercent"] < -1 and measured["actualTokens"] == round(predicted * 0.97)  # the real error
    store = book.current(NOW)[0].entries
    (key, samples), = store.items()
    assert (key.gpu_product, key.family) == ("H100-80GB", "qwen3")
    assert [s.deployment for s in samples] == [f"{NAMESPACE}/first"] and abs(samples[0].ratio - 0.97) < 0.001

    second = Run(H100_QWEN, calibration=book, name="second", uid="uid-second", cluster=FakeCluster())
    second.once()
    pin = second.status["kvCalibration"]
    assert abs(pin["ratio"] - 0.97) < 0.001 and pin["deployments"] == 1 and pin["specHash"]
    assert "KV calibrated \u2212" in pin["message"] and "from 1 deployment on H100-80GB" in pin["message"]
    assert any(r.startswith("kvCalibration") and pin["message"] in r for r in second.status["plan"]["reasons"])
    calibrated = second.status["plan"]["memory"]["kvCacheTokens"]
    block = 16
    assert abs(calibrated - round(predicted * 0.97)) <= block, (calibrated, predicted)
    # vLLM then reports what the calibrated plan predicted: within the tolerance, and the status names it
    serve(second, round(predicted * 0.97))
    second.once()
    verified = second.status["verification"]
    assert verified["verified"] is True and verified["calibration"] == pin["message"]
    # its own sample is against the uncalibrated prediction: still 0.97, not 0.97 x 0.97
    ratios = {s.deployment: s.ratio for s in book.current(NOW)[0].entries[key]}
    assert abs(ratios[f"{NAMESPACE}/second"] - 0.97) < 0.001, ratios

    # the first deployment keeps the calibration its spec was planned with (none): nothing rolls, nor on a scale
    first.once()
    assert "ratio" not in first.status["kvCalibration"] and deployment_args(first) == args_before
    first.generation, first.spec = 2, {**H100_QWEN, "replicas": 2}
    first.once()
    assert "ratio" not in first.status["kvCalibration"] and deployment_args(first) == args_before
    # a spec change takes the store as it is now
    first.generation, first.spec = 3, {**H100_QWEN, "serving": {**H100_QWEN["serving"], "expectedConcurrency": 4}}
    first.once()
    assert first.status["kvCalibration"]["deployments"] == 2 and deployment_args(first) != args_before


#: a plan whose flags follow the calibrated KV room: the longest max_model_len the L4's room holds
L4_AUTO = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-l4"}, "serving": {"maxModelLen": "auto"}}
L4_KEY = CalibrationKey("L4", "0.33.0", "qwen3")


def test_the_choice_is_recorded_before_the_children_so_a_lost_status_write_rolls_nothing() -> None:
    """Review finding 9: the pin went out with the status after the children. With that write lost, the next
    pass chose again from the store as it was then, and the deployment rolled because another one was measured.
    The pin is now recorded with the remediation step, before the first child is written."""
    now = datetime.now(UTC)  # the reconcile's own clock: samples must not be in its future
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    book.record(SampleToRecord(L4_KEY, Sample(0.97, now, "a/measured")), now)
    run = Run(L4_AUTO, calibration=book)
    run.once_losing_status()  # the children are written, the status Kopf writes after them is lost
    args = deployment_args(run)
    assert "plan" not in run.status  # the status after the children was really lost
    pin = run.status.get("kvCalibration")
    assert pin is not None and abs(pin["ratio"] - 0.97) < 0.001, run.status  # recorded before the children
    book.record(SampleToRecord(L4_KEY, Sample(0.955, now, "b/measured")), now)  # another deployment is measured
    run.once()
    assert deployment_args(run) == args  # planned with the recorded choice: no roll
    assert run.status["kvCalibration"]["ratio"] == pin["ratio"] and run.status["kvCalibration"]["deployments"] == 1
    # the next spec change takes the store as it is then: both deployments, another max_model_len
    run.generation, run.spec = 2, {**L4_AUTO, "serving": {"maxModelLen": "auto", "expectedConcurrency": 1}}
    run.once()
    assert run.status["kvCalibration"]["deployments"] == 2 and deployment_args(run) != args


def test_a_deployment_moved_to_another_vllm_version_is_not_calibrated_by_the_old_ones_samples() -> None:
    """Memory use drifts between vLLM versions: a sample measured under 0.33.0 does not calibrate the same
    deployment once its spec names 0.32.0, and it says so."""
    now = datetime.now(UTC)
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    book.record(SampleToRecord(L4_KEY, Sample(0.97, now, "a/measured")), now)
    run = Run(L4_AUTO, calibration=book)
    run.once()
    assert abs(run.status["kvCalibration"]["ratio"] - 0.97) < 0.001
    args = deployment_args(run)
    # without the canary's opt-out one replica with no free GPU beside it would hold the fleet (UpgradeHeld,
    # NoRoomForCanary): the fleet rolls at once here, so its pod template is the new release's plan
    run.generation, run.spec = 2, {**L4_AUTO, "vllm": {"version": "0.32.0"}, "rollout": {"canary": False}}
    run.once()
    pin = run.status["kvCalibration"]
    assert "ratio" not in pin and pin["vllmVersion"] == "0.32.0", pin
    assert "covers vLLM 0.33.0 only" in pin["message"], pin
    assert not any(r.startswith("kvCalibration") for r in run.status["plan"]["reasons"])
    uncalibrated = Run(run.spec)  # the same spec planned with no store at all
    uncalibrated.once()
    assert deployment_args(run) == deployment_args(uncalibrated) != args


def test_without_a_store_nothing_is_calibrated_and_nothing_fails() -> None:
    run = Run(H100_QWEN)
    run.once()
    assert run.status["kvCalibration"]["message"] == "not calibrated: the operator keeps no calibration store"
    assert not any(r.startswith("kvCalibration") for r in run.status["plan"]["reasons"])


def test_a_generation_planned_before_pins_stays_uncalibrated() -> None:
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    book.record(SampleToRecord(CalibrationKey("H100-80GB", "0.33.0", "qwen3"), Sample(0.97, NOW, "a/x")), NOW)
    run = Run(H100_QWEN)
    run.once()  # planned by an operator without a store, as an older operator did
    status = {k: v for k, v in run.status.items() if k != "kvCalibration"}
    run.status, run.calibration = status, book
    run.once()
    assert run.status["kvCalibration"]["message"] == PLANNED_BEFORE


def test_a_malformed_pin_is_chosen_again() -> None:
    run = Run(H100_QWEN)
    run.once()
    run.status["kvCalibration"] = {"generation": 1, "gpuProduct": "H100-80GB", "vllmVersion": "0.33.0",
                                   "family": "qwen3", "ratio": 40, "message": "forged"}
    run.once()
    assert run.status["kvCalibration"]["message"] == "not calibrated: the operator keeps no calibration store"
    assert "ratio" not in run.status["kvCalibration"]


def test_pods_of_another_release_calibrate_nothing_and_are_said() -> None:
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    run = Run(H100_QWEN, calibration=book)
    run.gatherer = Gatherer(run.cluster, versions=lambda address: "0.32.0+cu128")  # the spec plans for 0.33.0
    run.once()
    serve(run, round(run.status["plan"]["memory"]["kvCacheTokens"] * 0.97))  # a sample that would be kept
    run.cluster.pod_list[0]["status"]["podIP"] = "10.0.0.7"
    out = run.once()
    verification = run.status["verification"]
    assert verification["vllmVersion"] == "0.32.0"  # what the pod runs, not what the plan assumed
    assert "the pods run vLLM 0.32.0 but the plan was made for vLLM 0.33.0" in run.condition("PlanVerified")[
        "message"]
    assert ("Warning", "VLLMVersionMismatch") in [e[:2] for e in out.events]
    assert book.current(NOW)[0].entries == {} and book.writes == 0


def test_a_failed_read_keeps_the_last_store_and_is_tried_again_sooner() -> None:
    class Flaky(ConfigMaps):
        down = False

        def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
            if self.down:
                raise RuntimeError("(503) the API server is unavailable")
            return super().read_config_map(namespace, name)

    maps = Flaky()
    clock = [0.0]
    book = CalibrationBook(maps, OPERATOR_NS, ttl_seconds=60, clock=lambda: clock[0])
    maps.down = True
    assert book.current(NOW) == (None, "(503) the API server is unavailable")  # never read: said why
    maps.down = False
    clock[0] = 11  # retried after 10 s, not 60
    book.record(sample(0.97, "a/x"), NOW)
    maps.down, clock[0] = True, 80
    store, problem = book.current(NOW)
    assert problem is None and store is not None and KEY in store.entries  # the last store read, not an empty one


def test_the_same_figures_again_are_not_written_again() -> None:
    maps = ConfigMaps()
    book = CalibrationBook(maps, OPERATOR_NS)
    assert book.record(sample(0.97, "a/x"), NOW)
    assert not book.record(sample(0.97, "a/x", age=-timedelta(minutes=5)), NOW + timedelta(minutes=5))
    assert book.writes == 1 and maps.version == 1


def test_labels_and_annotations_others_put_on_the_configmap_are_kept() -> None:
    maps = ConfigMaps()
    book = CalibrationBook(maps, OPERATOR_NS)
    book.record(sample(0.97, "a/x"), NOW)
    maps.items[(OPERATOR_NS, CONFIGMAP_NAME)]["metadata"].update(
        labels={"team": "ml", "app.kubernetes.io/managed-by": "llm-autopilot"}, annotations={"argocd": "x"})
    book.record(sample(0.96, "b/y"), NOW)
    meta = maps.items[(OPERATOR_NS, CONFIGMAP_NAME)]["metadata"]
    assert meta["labels"]["team"] == "ml" and meta["annotations"] == {"argocd": "x"}


def test_every_pool_a_spec_is_planned_on_keeps_its_choice() -> None:
    """Two GPU pools: the calibration of each is fixed with the spec, so the next pass plans the same pool."""
    book = CalibrationBook(ConfigMaps(), OPERATOR_NS)
    book.record(SampleToRecord(CalibrationKey("L4", "0.33.0", "qwen3"), Sample(0.5, NOW, "a/x")), NOW)
    spec = {"model": {"name": "Qwen/Qwen3-8B"}, "serving": {"maxModelLen": 16384, "minMaxModelLen": 12288}}
    run = Run(spec, calibration=book)
    run.once()
    first = (run.status["plan"]["summary"], deployment_args(run))
    pin = run.status["kvCalibration"]
    assert {c["gpuProduct"] for c in pin["candidates"]} >= {"H100-80GB", "L4"}, pin
    for _ in range(2):
        run.once()
        assert (run.status["plan"]["summary"], deployment_args(run)) == first
        assert run.status["kvCalibration"] == pin and run.last is not None and "kvCalibration" not in run.last.status


def test_a_key_too_long_to_keep_is_not_calibrated_and_the_reconcile_goes_on() -> None:
    long = CalibrationKey("H100-80GB", "0.33.0", "x" * 300)
    found = Calibrations.of({}, {}, None, NOW).pin_for(long, None)  # type: ignore[arg-type]
    assert found.ratio is None and "too long" in found.message and len(found.family) == 253
