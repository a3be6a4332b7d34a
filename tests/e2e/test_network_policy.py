"""NetworkPolicies (issue #28 item 7): the chart's for the operator, and the one the operator renders per
LLMDeployment, behind the chart's one switch `networkPolicy.enabled`.

The local cluster has no CNI that enforces NetworkPolicies (nor any pod network: its nodes are KWOK's), so what is
tested is what is rendered and accepted by the API server, never that traffic is cut. The chart is installed with
the switch on; the operator runs as a local process with the chart's ServiceAccount token and the environment the
chart's Deployment sets, so the chart's RBAC for NetworkPolicies (get, create, patch, delete) is the one in use.
Restarted with the switch off (the chart's environment without it), the operator deletes the policies it rendered
and renders none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import CHART, Kubectl, Operator, wait_for
from tests.e2e.helpers import (
    EXAMPLES,
    NO_NAMESPACE,
    forbidden,
    one,
    operator_env,
    planned,
    run_helm,
    sa_kubeconfig,
)

pytestmark = pytest.mark.e2e

VLLM_PORT = 8000
#: the label set the operator gives every vLLM pod of one LLMDeployment (render/kubernetes.selector)
INSTANCE = "app.kubernetes.io/instance"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
CLIENTS = [{"namespaceSelector": {"matchLabels": {"team": "search"}}},
           {"podSelector": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["gateway"]}]}}]


@pytest.fixture
def release(chart_cluster: Kubectl, helm: Path, namespace: str) -> Iterator[str]:
    """The chart installed with the switch on, watching only the test namespace (its webhook selects no namespace
    here: the in-cluster Service is unreachable on this cluster)."""
    name = f"np-{namespace.removeprefix('e2e-')}"
    run_helm(helm, "install", name, str(CHART), "--namespace", namespace, "--wait=false",
             "--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{namespace}}}",
             "--set", f"webhook.namespaceSelector.matchLabels.{NO_NAMESPACE}",
             "--set", "networkPolicy.enabled=true",
             "--set", "networkPolicy.monitoringPodSelector.matchLabels.app\\.kubernetes\\.io/name=prometheus",
             env=chart_cluster.env)
    yield name
    run_helm(helm, "uninstall", name, "--namespace", namespace, env=chart_cluster.env, check=False)


def model(name: str, network: dict[str, Any] | None = None) -> str:
    doc = yaml.safe_load((EXAMPLES / "qwen3-8b-l4.yaml").read_text())
    doc["metadata"]["name"] = name
    if network is not None:
        doc["spec"]["network"] = network
    return yaml.safe_dump(doc)


def chart_env(kubectl: Kubectl, release: str, namespace: str) -> dict[str, str]:
    """The NetworkPolicy settings the installed chart's Deployment gives the operator."""
    deployment = kubectl.json("deployment", f"{release}-llm-autopilot", "-n", namespace)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if e["name"].startswith("LLM_AUTOPILOT_NETWORK_POLICY")}


def policy(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = kubectl.maybe("networkpolicy", name, "-n", namespace)
    return found


def ingress(found: dict[str, Any]) -> list[tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]]:
    """Each rule's sources (None: from anywhere) and ports (None: every port)."""
    return [(rule.get("from"), rule.get("ports")) for rule in found["spec"]["ingress"]]


def test_network_policies_follow_the_charts_switch(chart_cluster: Kubectl, release: str, namespace: str,
                                                   tmp_path: Path) -> None:
    kubectl = chart_cluster
    # the chart's own policy for the operator's pods: the webhook from anywhere, /metrics from Prometheus
    operator_policy = kubectl.json("networkpolicy", f"{release}-llm-autopilot", "-n", namespace)
    assert operator_policy["spec"]["policyTypes"] == ["Ingress"]
    assert operator_policy["spec"]["podSelector"]["matchLabels"][INSTANCE] == release
    assert ingress(operator_policy) == [
        (None, [{"port": 9443, "protocol": "TCP"}]),  # no `from`: the API server is not a pod in most clusters
        ([MONITORING], [{"port": 9090, "protocol": "TCP"}]),
    ]

    env = chart_env(kubectl, release, namespace)
    operator_peer = json.loads(env["LLM_AUTOPILOT_NETWORK_POLICY_OPERATOR"])
    assert env["LLM_AUTOPILOT_NETWORK_POLICY"] == "true"
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    assert operator_peer["podSelector"]["matchLabels"][INSTANCE] == release
    assert json.loads(env["LLM_AUTOPILOT_NETWORK_POLICY_MONITORING"]) == MONITORING

    kubeconfig = sa_kubeconfig(kubectl, namespace, f"{release}-llm-autopilot", tmp_path / "sa.kubeconfig")
    on = Operator(operator_env(kubectl, kubeconfig, **env), tmp_path / "on.log",
                  ["--standalone", f"--namespace={namespace}"]).start()
    try:
        kubectl("apply", "-n", namespace, "-f", "-", input=model("listed", {"allowedClients": CLIENTS}))
        kubectl("apply", "-n", namespace, "-f", "-", input=model("unlisted"))
        kubectl("apply", "-n", namespace, "-f", "-", input=model("nobody", {"allowedClients": []}))
        for name in ("listed", "unlisted", "nobody"):
            wait_for(f"{name} planned", lambda name=name: planned(kubectl, namespace, name), timeout=90)
            wait_for(f"{name}'s NetworkPolicy", lambda name=name: policy(kubectl, namespace, name), timeout=60)
        uid = kubectl.json("llmd", "listed", "-n", namespace)["metadata"]["uid"]
        listed = policy(kubectl, namespace, "listed")
        assert listed is not None
        owner = listed["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("LLMDeployment", "listed", uid,
                                                                                       True)
        own_pods = {"app.kubernetes.io/name": "vllm", INSTANCE: "listed"}
        assert listed["spec"]["podSelector"] == {"matchLabels": own_pods}
        assert listed["spec"]["policyTypes"] == ["Ingress"]
        on_vllm = [{"port": VLLM_PORT, "protocol": "TCP"}]
        assert ingress(listed) == [
            (CLIENTS, on_vllm),  # spec.network.allowedClients
            ([MONITORING], on_vllm),  # Prometheus scrapes vLLM's /metrics
            ([operator_peer], on_vllm),  # verification, burn-in, runtime LoRA updates
            ([{"podSelector": {"matchLabels": own_pods}}], None),  # a replica's pods across nodes, every port
        ]
        unlisted = policy(kubectl, namespace, "unlisted")
        assert unlisted is not None and ingress(unlisted)[0] == ([{"podSelector": {}}], on_vllm)  # its namespace
        nobody = policy(kubectl, namespace, "nobody")
        assert nobody is not None and [peers for peers, _ in ingress(nobody)] == [
            [MONITORING], [operator_peer], [{"podSelector": {"matchLabels": {**own_pods, INSTANCE: "nobody"}}}]]
        assert all(rule.get("from") for rule in nobody["spec"]["ingress"])  # never an empty `from`
        # a malformed client is refused by the CRD's own rules too (with the webhook, by the operator's message)
        refused = kubectl("apply", "-n", namespace, "-f", "-", check=False,
                          input=model("bad", {"allowedClients": [{}]}))
        assert refused.returncode != 0 and "name a namespaceSelector, a podSelector or both" in refused.stderr
        assert forbidden(on.output()) == [], "\n".join(forbidden(on.output()))
    finally:
        on.stop()

    # the switch off: the chart's environment without it; the policies the operator rendered are deleted
    off = Operator(operator_env(kubectl, kubeconfig), tmp_path / "off.log",
                   ["--standalone", f"--namespace={namespace}"]).start()
    try:
        for name in ("listed", "unlisted", "nobody"):
            wait_for(f"{name}'s NetworkPolicy deleted", lambda name=name: policy(kubectl, namespace, name) is None,
                     timeout=60)
        mark = off.mark()
        off.wait_reconciles(namespace, "listed", 2, since=mark)
        assert policy(kubectl, namespace, "listed") is None, "the switch is off, yet a NetworkPolicy was rendered"
        assert kubectl.maybe("deployment", "listed", "-n", namespace) is not None
        assert forbidden(off.output()) == [], "\n".join(forbidden(off.output()))
    finally:
        off.stop()
    # the chart's own policy is the chart's: it stays until the switch is off in the chart
    assert kubectl.maybe("networkpolicy", f"{release}-llm-autopilot", "-n", namespace) is not None


def test_the_chart_renders_no_network_policy_with_the_switch_off(helm: Path) -> None:
    out = run_helm(helm, "template", "np", str(CHART), "--namespace", "np").stdout
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    assert [d for d in docs if d["kind"] == "NetworkPolicy"] == []
    env = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not [e for e in env if e["name"].startswith("LLM_AUTOPILOT_NETWORK_POLICY")]
