"""The NetworkPolicy of an LLMDeployment (render/network_policy.py): what each rule admits, never an empty `from`,
the chart's switch read from the environment, spec.network's refusals, and a policy left from before deleted once
the switch is off (through the reconcile's shell, on the in-memory cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from llm_autopilot.api.errors import validation_message
from llm_autopilot.api.v1alpha1 import LLMDeploymentSpec, NetworkPeer
from llm_autopilot.controller.settings import OperatorSettings, SettingsError
from llm_autopilot.render.kubernetes import Owner, selector
from llm_autopilot.render.network_policy import NetworkPolicySettings, network_policy
from llm_autopilot.render.vllm_args import VLLM_PORT
from tests.unit.fakes import Run

OWNER = Owner("qwen", "team-a", "uid-1")
OPERATOR = NetworkPeer.model_validate({
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm-autopilot"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llm-autopilot"}}})
MONITORING = NetworkPeer.model_validate({
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}})
ON = NetworkPolicySettings(operator=OPERATOR, monitoring=MONITORING)
MODEL = {"model": {"name": "Qwen/Qwen3-8B"}, "gpu": {"product": "nvidia-h100-80gb"}}
VLLM_ONLY = [{"port": VLLM_PORT, "protocol": "TCP"}]


def spec(**fields: Any) -> LLMDeploymentSpec:
    return LLMDeploymentSpec.model_validate({**MODEL, **fields})


def rules(policy: dict[str, Any]) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    return [(rule["from"], rule.get("ports")) for rule in policy["spec"]["ingress"]]


def test_the_policy_admits_clients_prometheus_and_the_operator_on_vllms_port_and_its_own_pods_on_every_port() -> None:
    clients = [{"namespaceSelector": {"matchLabels": {"team": "a"}}},
               {"namespaceSelector": {}, "podSelector": {"matchExpressions": [
                   {"key": "role", "operator": "In", "values": ["gateway"]}]}}]
    policy = network_policy(OWNER, spec(network={"allowedClients": clients}), ON)
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    meta = policy["metadata"]
    assert (meta["name"], meta["namespace"]) == ("qwen", "team-a")
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector(OWNER)}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress is left as it was
    assert rules(policy) == [
        (clients, VLLM_ONLY),
        ([MONITORING.to_kubernetes()], VLLM_ONLY),
        ([OPERATOR.to_kubernetes()], VLLM_ONLY),
        ([{"podSelector": {"matchLabels": selector(OWNER)}}], None),  # a replica's pods across nodes
    ]


def test_without_allowed_clients_the_namespaces_own_pods_are_the_clients() -> None:
    assert rules(network_policy(OWNER, spec(), ON))[0] == ([{"podSelector": {}}], VLLM_ONLY)
    assert rules(network_policy(OWNER, spec(network={}), ON))[0] == ([{"podSelector": {}}], VLLM_ONLY)


@pytest.mark.parametrize("settings", [ON, NetworkPolicySettings(), NetworkPolicySettings(operator=OPERATOR)])
def test_no_rule_has_an_empty_from_which_would_admit_every_source(settings: NetworkPolicySettings) -> None:
    policy = network_policy(OWNER, spec(network={"allowedClients": []}), settings)
    assert all(rule.get("from") for rule in policy["spec"]["ingress"])
    # no client named, no monitoring, no operator: only the model's own pods
    expected = 1 + (settings.monitoring is not None) + (settings.operator is not None)
    assert len(policy["spec"]["ingress"]) == expected


def test_the_policy_is_rendered_only_with_the_switch_on() -> None:
    off = Run(MODEL)
    off.once()
    assert ("NetworkPolicy", "x") not in off.cluster.objects
    on = Run(MODEL, settings=OperatorSettings(network_policy=ON))
    on.once()
    assert on.cluster.objects[("NetworkPolicy", "x")]["spec"]["podSelector"]["matchLabels"][
        "app.kubernetes.io/instance"] == "x"


def test_a_policy_left_from_before_is_deleted_once_the_switch_is_off() -> None:
    run = Run(MODEL, settings=OperatorSettings(network_policy=ON))
    run.once()
    assert ("NetworkPolicy", "x") in run.cluster.objects
    run.settings = OperatorSettings()
    run.once()
    assert ("NetworkPolicy", "x") not in run.cluster.objects
    assert run.cluster.deleted == [("NetworkPolicy", "x")]
    run.once()  # nothing left: nothing deleted again
    assert run.cluster.deleted == [("NetworkPolicy", "x")]


def test_a_policy_left_from_before_is_deleted_even_when_the_model_cannot_be_planned_now() -> None:
    # the policy's deletion does not wait for a plan: a policy no longer rendered cuts clients whatever the plan
    run = Run(MODEL, settings=OperatorSettings(network_policy=ON))
    run.once()
    assert ("NetworkPolicy", "x") in run.cluster.objects
    run.settings = OperatorSettings()
    run.spec = {**MODEL, "gpu": {"product": "nvidia-made-up-gpu"}}
    run.once()
    assert [c["reason"] for c in run.status["conditions"] if c["type"] == "Planned"] == ["UnknownGPU"]
    assert run.cluster.deleted == [("NetworkPolicy", "x")]


def test_a_policy_of_the_same_name_the_object_does_not_own_is_left_alone() -> None:
    run = Run(MODEL)
    theirs = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "x", "namespace": "default", "ownerReferences": []}, "spec": {}}
    run.cluster.objects[("NetworkPolicy", "x")] = theirs
    run.once()
    assert run.cluster.objects[("NetworkPolicy", "x")] == theirs and run.cluster.deleted == []


# ---- the chart's switch, from the environment ----------------------------------------------------------------

def test_the_switch_and_its_peers_come_from_the_environment() -> None:
    assert OperatorSettings.from_env({}).network_policy is None
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_NETWORK_POLICY": "false",
                                      "LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR": "not read"}).network_policy is None
    on = OperatorSettings.from_env({
        "LLM_AUTOPILOT_NETWORK_POLICY": "true",
        "LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR": json.dumps(OPERATOR.to_kubernetes()),
        "LLM_AUTOPILOT_NETWORK_POLICY_MONITORING": json.dumps(MONITORING.to_kubernetes()),
    }).network_policy
    assert on == ON
    assert OperatorSettings.from_env({"LLM_AUTOPILOT_NETWORK_POLICY": "on"}).network_policy == NetworkPolicySettings()


@pytest.mark.parametrize("env, message", [
    ({"LLM_AUTOPILOT_NETWORK_POLICY": "maybe"}, "LLM_AUTOPILOT_NETWORK_POLICY='maybe': must be true or false"),
    ({"LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR": "{"}, "LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR: not JSON"),
    ({"LLM_AUTOPILOT_NETWORK_POLICY_MONITORING": "{}"}, "name a namespaceSelector, a podSelector or both"),
    ({"LLM_AUTOPILOT_NETWORK_POLICY_MONITORING": '{"podSelector": {"matchLabels": {"a b": "c"}}}'},
     "LLM_AUTOPILOT_NETWORK_POLICY_MONITORING.podSelector.matchLabels.a b"),
])
def test_a_malformed_switch_or_peer_stops_the_operator_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("{", r"\{").replace("(", r"\(")):
        OperatorSettings.from_env({"LLM_AUTOPILOT_NETWORK_POLICY": "true", **env})


# ---- spec.network's refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("client, message", [
    ({}, "spec.network.allowedClients[0]: name a namespaceSelector, a podSelector or both; for every pod of the "
         "cluster write namespaceSelector: {}"),
    ({"podSelector": {"matchExpressions": [{"key": "role", "operator": "In"}]}},
     "operator In needs values: the label values to match"),
    ({"podSelector": {"matchExpressions": [{"key": "role", "operator": "Exists", "values": ["x"]}]}},
     "operator Exists takes no values: remove them"),
    ({"podSelector": {"matchLabels": {"not a key": "x"}}}, "is not a valid label key"),
    ({"namespaceSelector": {"matchLabels": {"team": "not a value"}}}, "matchLabels"),
    ({"ipBlock": {"cidr": "10.0.0.0/8"}}, "ipBlock"),
])
def test_a_malformed_client_is_refused_with_what_to_write(client: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(network={"allowedClients": [client]})
    assert message in validation_message(caught.value)


def test_too_many_clients_are_refused() -> None:
    with pytest.raises(ValidationError):
        spec(network={"allowedClients": [{"podSelector": {}}] * 5})
