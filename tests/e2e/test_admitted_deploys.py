"""Admitted => rendered => accepted, on the real API server.

Every LLMDeployment hypothesis makes up (hostile names, env, resources, selectors, tolerations, images, variants,
extraArgs, architectures) is either refused at `kubectl apply` (by the webhook's logic, `admission.review`, or by
the CRD's schema and CEL rules in a server-side dry run), or the Deployment, Service and PodDisruptionBudget the
reconciler would render for it (its own context/plan_with/render, on the local cluster's simulated GPU nodes) are
accepted by a server-side apply dry run. An admitted spec whose objects the API server rejects is a failure: the
user saw OK, and the operator would retry a 422 forever. So is a spec the webhook's logic admits but the CRD
(generated from the same models) refuses.

LLM_AUTOPILOT_PROPERTY_EXAMPLES sets the number of generated specs (default 150; a few minutes on 2 cores). The run
is deterministic (derandomize, no example database); the bad-input review's known failures are explicit examples.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import huggingface_hub.constants
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from llm_autopilot.api import GROUP, KIND, VERSION
from llm_autopilot.controller.admission import review
from llm_autopilot.remediation.ladder import Overrides
from llm_autopilot.vllm.versions import DEFAULT_VLLM_VERSION
from tests.e2e.conftest import OWN_PREFIX, Kubectl, _create_namespace, _delete_namespace
from tests.render_driver import NotRendered, render_objects

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("LLM_AUTOPILOT_PROPERTY_EXAMPLES", "150"))
V = str(DEFAULT_VLLM_VERSION)
MANAGER = "llm-autopilot"

# --- strategies: a clean spec (valid values, which may still not fit or not resolve), or a hostile one (the bad
# values the review found mixed into every field) --------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["", " ", "a b", "../x", "--flag", "x\x00y", "Ünï", "a" * 300, "UPPER", "-lead",
                                "trail-", "a=b", "x\ny", "😀", "1.5", "a/b/c", "..", ".", "'quote'", "a" * 64])


def pick(hostile: bool, valid: st.SearchStrategy[Any],
         bad: st.SearchStrategy[Any] = HOSTILE_TEXT) -> st.SearchStrategy[Any]:
    """``valid``; in a hostile spec, sometimes ``bad`` instead."""
    return st.one_of(valid, valid, bad) if hostile else valid


CATALOG = st.sampled_from(["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.1-8B-Instruct",
                           "hf://Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "qwen/qwen3-8b"])
COMPLETE_ARCHITECTURE = st.fixed_dictionaries({
    "hiddenSize": st.sampled_from([512, 1024, 4096]), "numHiddenLayers": st.integers(1, 48),
    "numAttentionHeads": st.sampled_from([8, 16, 32]), "intermediateSize": st.sampled_from([2048, 11008]),
    "vocabSize": st.sampled_from([32000, 151936]),
}, optional={"numKeyValueHeads": st.sampled_from([1, 4, 8]), "maxPositionEmbeddings": st.sampled_from([4096, 32768])})
PARTIAL_ARCHITECTURE = st.fixed_dictionaries({}, optional={
    "numKeyValueHeads": st.sampled_from([4, 5, 8]), "maxPositionEmbeddings": st.sampled_from([8192, 16384, 131072]),
    "numHiddenLayers": st.sampled_from([8, 36])})


def names(h: bool) -> st.SearchStrategy[str]:
    return pick(h, st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True) | st.just("a" * 63),
                st.sampled_from(["a" * 64, "qwen3.8b", "1llama", "Qwen3", "q_1", "x-", "a" * 253]))


def model(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    hub_ids = pick(h, st.sampled_from(["Qwen/Qwen3-32B-FP8", "acme/model-awq", "org/m.v2_x"]),
                   st.sampled_from(["--trust-remote-code", "/etc", "../../x", "https://x.io/m", "org/..", "a b/c"]))
    catalog = st.fixed_dictionaries({"name": CATALOG}, optional={
        "servedModelName": pick(h, st.sampled_from(["qwen", "my model"]), st.sampled_from(["-x", "a\tb"])),
        "variants": st.fixed_dictionaries({}, optional={"fp8": hub_ids, "awq": hub_ids}),
        "hubTokenSecretRef": st.fixed_dictionaries({"name": object_names(h)}, optional={"key": config_keys(h)}),
        "architecture": PARTIAL_ARCHITECTURE,
        "revision": pick(h, st.sampled_from(["main", "v1.0"]), st.just("-x")),
    })
    inline = st.fixed_dictionaries({"name": st.sampled_from(["acme/private-model", "org/m"]),
                                    "architecture": COMPLETE_ARCHITECTURE})
    return pick(h, catalog | catalog | inline, st.fixed_dictionaries({"name": HOSTILE_TEXT}))


def object_names(h: bool) -> st.SearchStrategy[str]:
    return pick(h, st.sampled_from(["hf-token", "api", "s.1"]), st.sampled_from(["Bad_Name", "", "a" * 254]))


def config_keys(h: bool) -> st.SearchStrategy[str]:
    return pick(h, st.sampled_from(["token", "KEY_1", ".dot"]), st.sampled_from(["a/b", "..", "", "a b"]))


def label_keys(h: bool) -> st.SearchStrategy[str]:
    return pick(h, st.sampled_from(["pool", "example.com/pool", "nvidia.com/gpu.product", "kwok.x-k8s.io/node"]),
                st.sampled_from(["bad key", "-x", "/x", "a/b/c", "a" * 64, "-x.io/pool", ""]))


def label_values(h: bool) -> st.SearchStrategy[str]:
    return pick(h, st.sampled_from(["a100", "NVIDIA-L4", "", "x.y_z"]))


def gpu(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    toleration = st.fixed_dictionaries({}, optional={
        "key": label_keys(h), "operator": pick(h, st.sampled_from(["Exists", "Equal"]), st.just("Bogus")),
        "value": label_values(h),
        "effect": pick(h, st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]), st.just("Bad")),
        "tolerationSeconds": pick(h, st.sampled_from([0, 30, -5]), st.just(2**63)),
    })
    selector = st.dictionaries(label_keys(h), label_values(h), max_size=2)
    named = st.fixed_dictionaries({}, optional={
        "product": pick(h, st.sampled_from(["nvidia-l4", "nvidia-h100-80gb", "nvidia-a100-40gb", "NVIDIA-L4", "h100"]),
                        st.sampled_from(["NVIDIA L4", "gtx-970", ""])),
        "maxGPUs": pick(h, st.sampled_from([1, 2, 8]), st.sampled_from([0, 65])),
        "nodeSelector": selector, "tolerations": st.lists(toleration, max_size=3),
    })
    by_memory = st.fixed_dictionaries({"memoryGiB": pick(h, st.sampled_from([24, 80]), st.sampled_from([0, 2000]))},
                                      optional={"computeCapability": pick(h, st.sampled_from(["9.0", "8.9"]),
                                                                          st.just("x")),
                                                "nodeSelector": selector})
    return named | named | by_memory


def env(h: bool) -> st.SearchStrategy[list[dict[str, Any]]]:
    names_ = pick(h, st.sampled_from(["VLLM_LOGGING_LEVEL", "A", ".hidden", "x-y.z", "VLLM_API_KEY"]),
                  st.sampled_from(["A=B", "1X", "..", ".", "a b", "", "HF_TOKEN"]))
    source = st.one_of(
        st.fixed_dictionaries({"secretKeyRef": st.fixed_dictionaries(
            {"name": object_names(h), "key": config_keys(h)}, optional={"optional": st.booleans()})}),
        st.fixed_dictionaries({"configMapKeyRef": st.fixed_dictionaries(
            {"name": object_names(h), "key": config_keys(h)})}),
        st.fixed_dictionaries({"fieldRef": st.fixed_dictionaries(
            {"fieldPath": pick(h, st.sampled_from(["metadata.name", "status.podIP", "metadata.labels['app']"]),
                               st.sampled_from(["spec.x", "metadata.labels"]))},
            optional={"apiVersion": pick(h, st.just("v1"), st.just("v2"))})}),
        st.fixed_dictionaries({"resourceFieldRef": st.fixed_dictionaries(
            {"resource": pick(h, st.sampled_from(["limits.cpu", "requests.memory"]), st.just("limits.gpu"))},
            optional={"divisor": pick(h, st.sampled_from(["1m", "1Mi", 1]), st.sampled_from(["1Gi", "3"])),
                      "containerName": pick(h, st.just("vllm"), st.just("other"))})}),
    )
    broken = st.sampled_from([{}, {"secretRef": {"name": "s"}},
                              {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}])
    values = pick(h, st.sampled_from(["1", "", "DEBUG", "$$(x)", "cost $5"]),
                  st.sampled_from(["$(OVR)", "--max-model-len=1", "sk-SECRET"]))
    secret_literal = st.fixed_dictionaries({"name": st.sampled_from(["HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD",
                                                                     "LWS_WORKER_INDEX", "LLM_AUTOPILOT_X"]),
                                            "value": st.just("sk-SECRET")})
    literal = st.fixed_dictionaries({"name": names_}, optional={"value": values})
    literal = pick(h, literal, secret_literal)
    sourced = st.fixed_dictionaries({"name": names_, "valueFrom": pick(h, source, broken)},
                                    optional={"value": pick(h, st.just(""), st.just("x"))})
    return st.lists(literal | sourced, max_size=3, unique_by=None if h else (lambda v: v["name"]))


def resources(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    quantities = pick(h, st.one_of(st.integers(0, 64), st.sampled_from(["500m", "8", "64Gi", "1.5Gi", "1e9", ".5",
                                                                        "2Ti"])),
                      st.sampled_from(["-1", "lots", "1K", "", "1 Gi", -1, 0.5, True, "+1"]))
    keys = pick(h, st.sampled_from(["cpu", "memory", "ephemeral-storage"]),
                st.sampled_from(["nvidia.com/gpu", "hugepages-2Mi"]))
    listed = st.dictionaries(keys, quantities, max_size=3)
    return st.fixed_dictionaries({}, optional={"requests": listed, "limits": listed})


def vllm(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    args = pick(h, st.sampled_from(["--enable-prefix-caching", "4096", "--trust-remote-code", "-1.5",
                                    "--chat-template=" + "x" * 3000, "--kv-offloading-size", "--seed", "$$(x)"]),
                st.sampled_from(["--api-key", "sk-x", "--api-key=sk", "--port", "9000", "--host", "0.0.0.0", "--uds",
                                 "/tmp/s", "", "a\x00b", "--swap-space", "--hf-token", "x" * 5000,
                                 # issue 15: owned flags in every spelling, and what the kubelet expands
                                 "--max-model-len", "--max_model_len=2048", "--max-model=1", "-tp", "-t",
                                 "--tensor_parallel_size=99", "--kv_cache_dtype", "--compilation-config.level=3",
                                 "-O0", "-O3", "-cc", "--nnodes", "-n2", "--node-rank=1", "--headless",
                                 "--master-addr", "-dp", "--config", "$(OVR)", "--x=$(HOME)", "$$$(A)"]))
    return st.fixed_dictionaries({}, optional={
        "image": pick(h, st.sampled_from(["vllm/vllm-openai:v0.33.0", "registry.local:5000/vllm:v1", "Vllm/x",
                                          "vllm/vllm-openai@sha256:" + "a" * 64]),
                      st.sampled_from([" vllm/vllm-openai", "vllm/vllm openai", "", "x" * 600])),
        "version": pick(h, st.sampled_from(["0.33.0", "0.10.2", "v0.19.1"]), st.sampled_from(["latest", "0.5.0"])),
        "extraArgs": st.lists(args, max_size=4),
        "env": env(h),
        "enforceEager": st.booleans(),
    })


def serving(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "maxModelLen": pick(h, st.sampled_from([4096, 8192, 32768]), st.sampled_from([10**9, 0])),
        "minMaxModelLen": st.sampled_from([1024, 4096, 65536]),
        "allowedQuantizations": pick(h, st.sampled_from([["none", "fp8"], ["none"]]), st.sampled_from([[], ["int3"]])),
        "allowedKVCacheDtypes": pick(h, st.sampled_from([["auto", "fp8"], ["fp8"]]), st.just([])),
    })


def specs(h: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"model": model(h)}, optional={
        "gpu": gpu(h), "serving": serving(h), "vllm": vllm(h), "resources": resources(h),
        "replicas": pick(h, st.sampled_from([0, 1, 2]), st.sampled_from([-1, 1001])),
        "remediation": st.fixed_dictionaries({}, optional={
            "floors": st.fixed_dictionaries({}, optional={"minMaxModelLen": st.sampled_from([1024, 10**6])}),
            "maxReplicas": st.sampled_from([1, 4]),
            # issue 15: numbers the code downstream cannot handle
            "cooldownSeconds": pick(h, st.sampled_from([0, 600]), st.sampled_from([10**12, 2**63 - 1])),
            "kvSaturationWindowSeconds": pick(h, st.sampled_from([60, 300]), st.sampled_from([10**9, 86401])),
            "stableWindowSeconds": pick(h, st.sampled_from([60, 3600]), st.just(10**15))}),
    })


#: (name, spec): half of them clean, half hostile
CASES = st.booleans().flatmap(lambda hostile: st.tuples(names(hostile), specs(hostile)))
#: remediation's overrides of the container memory limit and the replicas (the ladder's OOMKilled and KV rungs)
OVERRIDES = st.one_of(st.none(), st.builds(Overrides, memory_limit_gib=st.floats(1, 4000), replicas=st.integers(0, 3)))


# --- classification -------------------------------------------------------------------------------------------


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    schema_only: list[str] = field(default_factory=list)

    def summary(self) -> str:
        c = self.counts
        lines = [f"admitted => rendered => accepted: {c['tried']} specs tried",
                 f"  refused at admission (webhook logic): {c['admission']} "
                 f"({c['admission-field']} naming a field, {c['admission-plan']} by the planner)",
                 f"  refused by the CRD's schema/CEL (server dry run): {c['schema']}",
                 f"  admitted but not rendered (Planned=False at reconcile): {c['not-rendered']}",
                 f"  rendered and accepted by server-side apply (dry run): {c['accepted']}",
                 f"  admitted but the API server rejects the objects: {len(self.failures)}"]
        lines += [f"  (webhook logic admitted, CRD refused: {m})" for m in self.schema_only[:5]]
        return "\n".join(lines)


def llmd(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec}


def classify(kubectl: Kubectl, namespace: str, tally: Tally, name: str, spec: dict[str, Any],
             overrides: Overrides | None) -> None:
    tally.counts["tried"] += 1
    shown = f"name={name!r} spec={json.dumps(spec)[:1500]} overrides={overrides}"
    try:
        verdict = review(spec, V, name=name)
    except Exception as exc:  # the webhook must answer, never crash
        tally.failures.append(f"review() raised {exc!r} for {shown}")
        return
    if not verdict.allowed:
        tally.counts["admission"] += 1
        names_a_field = verdict.message.startswith(("spec", "metadata.name"))
        tally.counts["admission-field" if names_a_field else "admission-plan"] += 1
        if not verdict.message or "\n" in verdict.message:
            tally.failures.append(f"refusal is not one line: {verdict.message!r} for {shown}")
        return
    stored = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(llmd(name, spec)),
                     check=False)
    if stored.returncode != 0:
        assert "failed calling webhook" not in stored.stderr, f"a stale webhook configuration: {stored.stderr}"
        tally.counts["schema"] += 1
        tally.schema_only.append(stored.stderr.strip()[:300])
        return
    try:
        objects = render_objects(spec, name=name, namespace=namespace, overrides=overrides)
    except Exception as exc:  # reconcile would crash instead of setting a condition
        tally.failures.append(f"render raised {exc!r} for {shown}")
        return
    if isinstance(objects, NotRendered):
        tally.counts["not-rendered"] += 1
        return
    applied = kubectl("apply", "--server-side", "--dry-run=server", f"--field-manager={MANAGER}", "--force-conflicts",
                      "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                    "items": objects}), check=False)
    if applied.returncode != 0:
        tally.failures.append(f"{applied.stderr.strip()} for {shown}")
    else:
        tally.counts["accepted"] += 1


# --- the known failures of the bad-input review (D1, D2, D5, D6, D15, D20, D21, D22), as explicit examples ------

L4 = {"product": "nvidia-l4"}
Q8 = {"name": "Qwen/Qwen3-8B"}
KNOWN = [
    ("x", {"model": Q8, "gpu": {"memoryGiB": 80, "computeCapability": "9.0"}}),  # D1
    ("a" * 64, {"model": Q8, "gpu": L4}), ("qwen3.8b", {"model": Q8, "gpu": L4}),  # D2
    ("1llama", {"model": Q8, "gpu": L4}),
    ("x", {"model": {**Q8, "hubTokenSecretRef": {"name": "hf"}}, "gpu": L4,  # D5
           "vllm": {"env": [{"name": "HF_TOKEN", "value": "x"}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": "A=B", "value": "1"}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": "A", "value": "1",
                                                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": "A", "valueFrom": {"secretRef": {"name": "s"}}}]}}),
    ("x", {"model": Q8, "gpu": L4, "resources": {"requests": {"cpu": -1}}}),
    ("x", {"model": Q8, "gpu": L4, "resources": {"requests": {"memory": "lots"}}}),
    ("x", {"model": Q8, "gpu": L4, "resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}}),
    ("x", {"model": Q8, "gpu": L4, "resources": {"limits": {"cpu": "1", "memory": "8Gi"}}}),
    ("x", {"model": Q8, "gpu": {**L4, "nodeSelector": {"pool": "not a label"}}}),
    ("x", {"model": Q8, "gpu": {**L4, "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}),
    ("x", {"model": Q8, "gpu": {**L4, "tolerations": [{"key": "k", "tolerationSeconds": 30}]}}),
    ("x", {"model": Q8, "gpu": {**L4, "tolerations": [{"operator": "Equal", "value": "v"}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"image": " vllm/vllm-openai:v0.33.0 "}}),
    ("x", {"model": Q8, "gpu": {"product": "NVIDIA L4"}}),
    ("x", {"model": {"name": "Qwen/Qwen3-32B", "variants": {"fp8": "--trust-remote-code"}},  # D6
           "gpu": {"product": "nvidia-l40s", "maxGPUs": 1},
           "serving": {"maxModelLen": 8192, "allowedQuantizations": ["fp8"]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["--api-key", "sk-SECRET"]}}),  # D15
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["--host", "127.0.0.1", ""]}}),  # D21
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["--port", "9000"]}}),
    ("x", {"model": {**Q8, "architecture": {"numKeyValueHeads": 4}}, "gpu": L4}),  # D20
    ("x", {"model": Q8, "gpu": L4, "serving": {"allowedKVCacheDtypes": []}}),
    ("x", {"model": Q8, "gpu": L4, "serving": {"maxModelLen": 4096},  # D22
           "remediation": {"floors": {"minMaxModelLen": 9000}}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["x" * 100_000]}}),  # the unbounded extraArg
    ("x", {"model": {"name": "meta-llama/Llama-3.1-405B"}, "gpu": {"product": "nvidia-h100-80gb", "maxGPUs": 4}}),
    # issue 15: owned flags, $(VAR), huge numbers, credentials in env, a 1 MiB spec
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["--max_model_len=1"]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["-tp", "99", "--nnodes", "2", "--headless"]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"extraArgs": ["$(OVR)"],
                                            "env": [{"name": "OVR", "value": "--max-model-len=1"}]}}),
    ("x", {"model": Q8, "gpu": L4, "remediation": {"cooldownSeconds": 10**12}}),
    ("x", {"model": Q8, "gpu": L4, "remediation": {"kvSaturationWindowSeconds": 10**12}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": "VLLM_API_KEY", "value": "sk-SECRET"}]}}),
    ("x", {"model": Q8, "gpu": L4, "vllm": {"env": [{"name": f"V{i}", "value": "x" * 16384} for i in range(64)]}}),
]


def known_examples(test: Any) -> Any:
    for case in reversed(KNOWN):
        test = example(case=case, overrides=None)(test)
    return example(case=("x", {"model": Q8, "gpu": L4, "resources": {"requests": {"memory": "2000Gi"}}}),
                   overrides=Overrides(memory_limit_gib=1843.0))(test)  # remediation's limit below the request


def test_admitted_specs_render_objects_the_api_server_accepts(kubectl: Kubectl, namespace: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # models outside the catalog are not fetched: the reconciler would set Planned=False (ModelUnresolved)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    tally = Tally()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @known_examples
    @given(case=CASES, overrides=OVERRIDES)
    def check(case: tuple[str, dict[str, Any]], overrides: Overrides | None) -> None:
        classify(kubectl, namespace, tally, *case, overrides)

    check()
    with capsys.disabled():
        print("\n" + tally.summary())
    assert tally.counts["tried"] >= EXAMPLES
    assert tally.counts["accepted"] > 0 and tally.counts["admission"] > 0  # both sides of the property were reached
    assert not tally.failures, "\n".join(tally.failures[:20])
    # the CRD is generated from the same models: what the webhook's logic admits, the schema must store
    assert not tally.schema_only, "the models admit what the CRD refuses:\n" + "\n".join(tally.schema_only[:20])


# --- without the webhook: what the CRD alone refuses ---------------------------------------------------------

CRD_REFUSES = [
    ("qwen3.8b", {"model": Q8}, "DNS-1035"),
    ("a" * 64, {"model": Q8}, "DNS-1035"),
    ("x", {"model": Q8, "serving": {"maxModelLen": 4096}, "remediation": {"floors": {"minMaxModelLen": 9000}}},
     "floors.minMaxModelLen"),
    ("x", {"model": {**Q8, "hubTokenSecretRef": {"name": "hf"}}, "vllm": {"env": [{"name": "HF_TOKEN", "value": "x"}]}},
     "HF_TOKEN"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}, "Duplicate"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "A=B", "value": "1"}]}}, "spec.vllm.env[0].name"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "A", "value": "1",
                                          "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}}, "not both"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "A", "valueFrom": {}}]}}, "exactly one"),
    ("x", {"model": Q8, "resources": {"requests": {"cpu": -1}}}, "spec.resources.requests.cpu"),
    ("x", {"model": Q8, "resources": {"requests": {"memory": "lots"}}}, "spec.resources.requests.memory"),
    ("x", {"model": Q8, "gpu": {"nodeSelector": {"pool": "not a label"}}}, "spec.gpu.nodeSelector"),
    ("x", {"model": Q8, "gpu": {"nodeSelector": {"bad key": "v"}}}, "label keys"),
    ("x", {"model": Q8, "gpu": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}}, "value must be"),
    ("x", {"model": Q8, "gpu": {"tolerations": [{"key": "k", "tolerationSeconds": 30}]}}, "NoExecute"),
    ("x", {"model": Q8, "gpu": {"tolerations": [{"operator": "Equal", "value": "v"}]}}, "key is required"),
    ("x", {"model": Q8, "vllm": {"image": " vllm/vllm-openai:v0.33.0 "}}, "spec.vllm.image"),
    ("x", {"model": Q8, "gpu": {"product": "NVIDIA L4"}}, "spec.gpu.product"),
    ("x", {"model": {**Q8, "variants": {"fp8": "--trust-remote-code"}}}, "spec.model.variants.fp8"),
    ("x", {"model": Q8, "serving": {"allowedKVCacheDtypes": []}}, "spec.serving.allowedKVCacheDtypes"),
    ("x", {"model": Q8, "vllm": {"extraArgs": ["x" * 5000]}}, "spec.vllm.extraArgs[0]"),
    # issue 15
    ("x", {"model": Q8, "vllm": {"extraArgs": ["$(OVR)"]}}, "spec.vllm.extraArgs[0]"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "OVR", "value": "--x=$(HOME)"}]}}, "spec.vllm.env[0].value"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "VLLM_API_KEY", "value": "sk"}]}}, "secretKeyRef"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": "LWS_WORKER_INDEX", "value": "1"}]}}, "set by the operator"),
    ("x", {"model": Q8, "remediation": {"cooldownSeconds": 10**12}}, "spec.remediation.cooldownSeconds"),
    ("x", {"model": Q8, "remediation": {"kvSaturationWindowSeconds": 10**12}},
     "spec.remediation.kvSaturationWindowSeconds"),
    ("x", {"model": Q8, "vllm": {"maxNumSeqs": 10**12}}, "spec.vllm.maxNumSeqs"),
    ("x", {"model": Q8, "vllm": {"env": [{"name": f"V{i}", "value": "x" * 16384} for i in range(64)]}},
     "spec.vllm.env[0].value"),  # 1 MiB: refused by the schema naming the field, not by a webhook's 413
]


@pytest.fixture(scope="module")
def dry_run_namespace(kubectl: Kubectl) -> Iterator[str]:
    """One namespace for the cases below, which only dry-run (nothing is stored in it): a namespace of its own
    per case cost each one a kubectl create and delete. No operator watches it (not `e2e-op-*`)."""
    name = f"{OWN_PREFIX}{uuid.uuid4().hex[:8]}"
    _create_namespace(kubectl, name, session_operator=False)
    yield name
    _delete_namespace(kubectl, name)


@pytest.mark.parametrize(("name", "spec", "needle"), CRD_REFUSES, ids=[n for *_, n in CRD_REFUSES])
def test_the_crd_alone_refuses_what_the_api_server_would_reject(kubectl: Kubectl, dry_run_namespace: str, name: str,
                                                                spec: dict[str, Any], needle: str) -> None:
    result = kubectl("apply", "--dry-run=server", "-n", dry_run_namespace, "-f", "-",
                     input=json.dumps(llmd(name, spec)), check=False)
    assert kubectl.maybe("llmd", name, "-n", dry_run_namespace) is None, "a dry run stored the object"
    assert result.returncode != 0, f"the API server stored {spec}"
    assert "denied the request" not in result.stderr  # the schema and CEL refused it, before any webhook
    assert needle in result.stderr, result.stderr


# --- the scale subresource of an object without spec.replicas (issue 15) ---------------------------------------


def test_an_object_without_replicas_has_a_working_scale_subresource(kubectl: Kubectl, namespace: str) -> None:
    """The CRD defaults spec.replicas to 1: /scale answers (it was a 500, "the spec replicas field does not
    exist") and `kubectl get llmd` shows REPLICAS. No operator: this is the API server's own doing."""
    name = "no-replicas"
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(llmd(name, {"model": Q8, "gpu": L4})))
    assert kubectl.json("llmd", name, "-n", namespace)["spec"]["replicas"] == 1
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/llmdeployments/{name}/scale"
    scale = json.loads(kubectl("get", "--raw", path).stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 1, scale
    header, row = kubectl("get", "llmd", name, "-n", namespace).stdout.splitlines()[:2]
    start = header.index("REPLICAS")  # columns are left-aligned under their header
    assert row[start:start + len("REPLICAS")].strip() == "1", (header, row)
    kubectl("scale", "llmd", name, "-n", namespace, "--replicas=2")
    assert json.loads(kubectl("get", "--raw", path).stdout)["spec"]["replicas"] == 2
