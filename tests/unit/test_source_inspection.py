"""A pvc:// source the catalog does not know: its volume is inspected by a Job, and the planner plans on what the
volume's config.json says; every failure is a condition naming the claim and the path, with nothing applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llm_autopilot.api.inspection import (
    MESSAGE_LIMIT,
    REPORT_VERSION,
    InspectionFailure,
    InspectionReport,
    ReportError,
    encode,
    parse_report,
)
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec
from llm_autopilot.catalog.hf_config import parse_hf_config, planner_view
from llm_autopilot.controller import inspect_step
from llm_autopilot.controller.admission import review
from llm_autopilot.render import inspect
from llm_autopilot.render.kubernetes import Owner
from llm_autopilot.storage.inspect import InspectError, inspect_folder
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.unit.fakes import NAME, NAMESPACE, FakeCluster, Run

V = str(DEFAULT_VLLM_VERSION)
CONFIGS = Path("/work/shared/data/model-configs")
#: a model outside the catalog (the tiny test model's shape, 4x larger)
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024,
          "vocab_size": 32000, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
          "rope_parameters": {"rope_theta": 10000.0}, "bos_token_id": 1, "transformers_version": "5.19.0"}
SPEC = {"model": {"name": "acme/private-llama", "source": "pvc://weights/acme/private-llama"},
        "gpu": {"product": "nvidia-h100-80gb", "tolerations": [{"key": "gpu", "operator": "Exists"}]}}
CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "weights", "namespace": NAMESPACE, "uid": "claim-uid-1"}}


def model_folder(tmp_path: Path, config: dict[str, Any] | str = CONFIG, weights: dict[str, int] | None = None,
                 index: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "acme" / "private-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for name, size in (weights if weights is not None else {"model.safetensors": 3000}).items():
        (folder / name).write_bytes(b"\0" * size)
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "tokenizer.json").write_text("{}")
    return folder


# --- the inspect command (in the Job) ------------------------------------------------------------------


def test_the_report_carries_the_planner_fields_and_the_weights_bytes_on_disk(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, weights={"model-00001-of-00002.safetensors": 1000,
                                             "model-00002-of-00002.safetensors": 2500},
                          index={"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}})
    report = inspect_folder(folder)
    assert report.checkpoint_bytes == 3500 and report.weight_files == 2 and report.files == 5
    assert "rope_parameters" not in report.config and "transformers_version" not in report.config
    assert report.config["hidden_size"] == 512
    assert parse_report(encode(report)) == report


@pytest.mark.parametrize(("make", "expected"), [
    (lambda f: (f / "config.json").unlink(), "no config.json in"),
    (lambda f: (f / "config.json").write_text("{not json"), "is not valid JSON"),
    (lambda f: (f / "config.json").write_text("[1, 2]"), "is not a JSON object"),
    (lambda f: (f / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": "big"})),
     "config field 'hidden_size' must be a whole number"),
    (lambda f: (f / "model.safetensors").unlink(), "no *.safetensors weights in"),
    (lambda f: (f / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "model-00002-of-00002.safetensors"}})), "names 1 shard(s) that are not in"),
])
def test_a_folder_that_is_no_plannable_model_says_why(tmp_path: Path, make: Any, expected: str) -> None:
    folder = model_folder(tmp_path)
    make(folder)
    with pytest.raises(InspectError, match=expected.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        inspect_folder(folder)


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match=r"/nope does not exist on the volume"):
        inspect_folder(tmp_path / "nope")


@pytest.mark.skipif(not CONFIGS.is_dir(), reason="needs the shared model configs")
def test_the_planner_view_describes_every_real_model_as_the_whole_config_does() -> None:
    paths = sorted(CONFIGS.glob("*.json"))
    assert len(paths) > 20
    for path in paths:
        config = json.loads(path.read_text())
        view = planner_view(config)
        assert parse_hf_config(view, "m", checkpoint_bytes=10) == parse_hf_config(config, "m", checkpoint_bytes=10), \
            path.name
        assert len(json.dumps(view, separators=(",", ":"))) < MESSAGE_LIMIT - 200, path.name


# --- the termination message, parsed strictly ------------------------------------------------------------

GOOD = InspectionReport(report=REPORT_VERSION, ok=True, config=planner_view(CONFIG), checkpoint_bytes=3000,
                        weight_files=1, files=3)


@pytest.mark.parametrize(("message", "expected"), [
    ("", "left no termination message"),
    ("Traceback (most recent call last):\n  File ...", "is not JSON: 'Traceback"),
    ("[1]", "is not a JSON object"),
    (json.dumps({"ok": True, "config": {}}), "is not an inspection report"),
    (encode(GOOD).replace('"files":3', '"files":3,"command":"rm -rf /"'), "Extra inputs are not permitted"),
    (encode(GOOD).replace('"hidden_size":512', '"hidden_size":512,"auto_map":{"x":"evil.py"}'),
     "fields the planner does not read: auto_map"),
    (encode(GOOD).replace('"checkpointBytes":3000', '"checkpointBytes":-5'), "greater than or equal to 1"),
    (encode(GOOD).replace('"checkpointBytes":3000', '"checkpointBytes":"3000"'), "checkpointBytes"),
    (json.dumps({"report": REPORT_VERSION, "ok": True, "config": {"hidden_size": 1}, "files": 1, "weightFiles": 1,
                 "pad": "x" * MESSAGE_LIMIT}), f"longer than {MESSAGE_LIMIT} bytes"),
    (json.dumps({"report": REPORT_VERSION, "ok": False}), "error: Field required"),
])
def test_a_forged_or_garbled_message_is_refused_in_one_line(message: str, expected: str) -> None:
    with pytest.raises(ReportError, match=None) as refused:
        parse_report(message)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_failure_report_is_parsed() -> None:
    failure = InspectionFailure(report=REPORT_VERSION, ok=False, error="no config.json in /model/x")
    assert parse_report(encode(failure)) == failure


# --- the Job --------------------------------------------------------------------------------------------


def test_the_job_mounts_the_claim_read_only_runs_the_operators_image_once_and_is_owned() -> None:
    spec = LLMDeploymentSpec.model_validate({**SPEC, "gpu": {**SPEC["gpu"], "nodeSelector": {"pool": "gpu"}}})
    source = spec.model.location
    assert isinstance(source, inspect_step.PVCSource)
    job = inspect.job(Owner(NAME, NAMESPACE, "uid"), spec, source, "claim-uid-1", "ghcr.io/x/op:1")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/x/op:1"
    assert [*container["command"], *container["args"]] == ["llm-autopilot", "inspect-volume",
                                                           "/model/acme/private-llama"]
    assert container["volumeMounts"] == [{"name": "model", "mountPath": "/model", "readOnly": True}]
    assert pod["volumes"] == [{"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}}]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["ttlSecondsAfterFinished"] == inspect.TTL_SECONDS
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid"
    assert len(inspect.job_name(Owner("a" * 63, NAMESPACE, "u"), source, "c")) <= 63


# --- the reconcile --------------------------------------------------------------------------------------


def job_of(run: Run) -> dict[str, Any]:
    jobs = [o for (kind, _), o in run.cluster.objects.items() if kind == "Job"]
    assert len(jobs) == 1, jobs
    return jobs[0]


def finish(run: Run, message: str, *, ok: bool = True) -> None:
    """The Job's pod ran to its end and the kubelet recorded its termination message."""
    job = job_of(run)
    name = job["metadata"]["name"]
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]} if ok else {
        "failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit"}]}
    run.cluster.job_pod_list[name] = [{"metadata": {"name": f"{name}-abc", "creationTimestamp": "2026-12-01T00:00:00Z"},
                                       "status": {"containerStatuses": [{"name": "inspect", "state": {"terminated": {
                                           "exitCode": 0 if ok else 2, "message": message}}}]}}]


def children(run: Run) -> set[str]:
    return {kind for kind, _ in run.cluster.objects if kind not in ("Job", "PersistentVolumeClaim")}


def test_admission_lets_a_pvc_model_outside_the_catalog_in_and_says_the_volume_is_read() -> None:
    verdict = review(SPEC, V)
    assert verdict.allowed
    assert any("read from pvc://weights/acme/private-llama by a short inspect Job" in w for w in verdict.warnings)


def test_a_pvc_model_is_planned_from_the_config_json_on_its_volume(tmp_path: Path) -> None:
    run = Run(SPEC, cluster=FakeCluster(objects={("PersistentVolumeClaim", "weights"): dict(CLAIM)}))
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "InspectingSource" and out.retry
    assert "pvc://weights/acme/private-llama (claim 'weights', path '/model/acme/private-llama')" in planned["message"]
    assert children(run) == set()  # only the Job, nothing deployed
    assert run.status["source"]["state"] == "Inspecting"
    run.once()  # the Job runs: still inspecting, nothing more applied
    assert run.condition("Planned")["reason"] == "InspectingSource" and children(run) == set()

    finish(run, encode(inspect_folder(model_folder(tmp_path))))
    run.once()
    assert run.condition("Planned")["status"] == "True", run.condition("Planned")
    source = run.status["source"]
    assert (source["state"], source["claimUID"], source["checkpointBytes"]) == ("Inspected", "claim-uid-1", 3000)
    assert source["config"]["hidden_size"] == 512
    vllm = run.cluster.deployment()["spec"]["template"]["spec"]["containers"][0]
    assert vllm["args"][0] == "/models/acme/private-llama"
    assert vllm["args"][vllm["args"].index("--served-model-name") + 1] == "acme/private-llama"
    assert int(vllm["args"][vllm["args"].index("--max-model-len") + 1]) <= 8192  # the volume's config.json
    assert run.status["plan"]["memory"]["kvBytesPerToken"] == 2 * 4 * 2 * (512 // 8) * 2  # K+V x layers x kv x dim

    # recorded: the next reconciles read neither the Job nor its pod (the TTL controller deletes the Job)
    del run.cluster.objects[("Job", job_of(run)["metadata"]["name"])]
    run.cluster.job_pod_list.clear()
    run.once()
    assert run.condition("Planned")["status"] == "True" and not any(k == "Job" for k, _ in run.cluster.objects)

    # a re-created claim (another uid) is inspected again, with nothing changed meanwhile
    run.cluster.objects[("PersistentVolumeClaim", "weights")]["metadata"]["uid"] = "claim-uid-2"
    run.once()
    assert run.condition("Planned")["reason"] == "InspectingSource"
    assert job_of(run)["metadata"]["annotations"]["llm-autopilot.io/claim-uid"] == "claim-uid-2"


def test_a_missing_claim_is_named_and_nothing_is_applied() -> None:
    run = Run(SPEC)
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "SourceNotFound" and out.retry
    assert "PersistentVolumeClaim 'weights' of spec.model.source pvc://weights/acme/private-llama does not exist " \
           "in namespace ns" in planned["message"]
    assert run.cluster.objects == {} and "source" not in run.status


@pytest.mark.parametrize(("message", "ok", "expected"), [
    (encode(InspectionFailure(report=REPORT_VERSION, ok=False,
                              error="no config.json in /model/acme/private-llama: the path must be ...")), False,
     "no config.json in /model/acme/private-llama"),
    ("error: internal error: Boom\n", False, "is not JSON"),
    ("", True, "left no termination message"),
    (encode(GOOD).replace('"files":3', '"files":3,"x":1'), True, "Extra inputs are not permitted"),
])
def test_a_failed_or_garbled_inspection_names_the_claim_and_path_and_applies_nothing(
        message: str, ok: bool, expected: str) -> None:
    run = Run(SPEC, cluster=FakeCluster(objects={("PersistentVolumeClaim", "weights"): dict(CLAIM)}))
    run.once()
    finish(run, message, ok=ok)
    out = run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "SourceUnreadable" and out.retry, planned
    assert "pvc://weights/acme/private-llama (claim 'weights', path '/model/acme/private-llama')" in planned["message"]
    assert expected in planned["message"] and "kubectl delete job" in planned["message"]
    assert children(run) == set() and run.status["source"]["state"] == "Failed"
    assert ("Warning", "SourceUnreadable") in [(t, r) for t, r, _ in out.events]


def test_a_config_the_planner_refuses_is_a_condition_not_a_traceback() -> None:
    run = Run(SPEC, cluster=FakeCluster(objects={("PersistentVolumeClaim", "weights"): dict(CLAIM)}))
    run.once()
    bad = GOOD.model_copy(update={"config": {**GOOD.config, "num_attention_heads": 7}})  # 512 % 7 != 0
    finish(run, encode(bad))
    run.once()
    planned = run.condition("Planned")
    assert planned["reason"] == "ModelUnresolved" and "acme/private-llama" in planned["message"], planned
    assert children(run) == set()


def test_a_catalog_model_or_an_inline_architecture_needs_no_inspection() -> None:
    for model in ({"name": "Qwen/Qwen3-8B", "source": "pvc://weights/qwen"},):
        run = Run({**SPEC, "model": model, "serving": {"maxModelLen": 16384}})
        run.once()
        assert run.condition("Planned")["status"] == "True" and not any(k == "Job" for k, _ in run.cluster.objects)
