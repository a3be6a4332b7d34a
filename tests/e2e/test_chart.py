"""The Helm chart (charts/llm-autopilot): lint, render, server-side dry-run, schema, RBAC, HA.

Helm is built from its Go module at a pinned version by hack/helm.py (cached like the control plane);
the ServiceMonitor/PodMonitor/PrometheusRule and cert-manager Certificate/Issuer CRDs come from those
projects' Go modules (hack/helm.py crds), so every rendered manifest can be dry-run against the local API
server. The operator is then run as a local process with the chart's ServiceAccount token: whatever it
needs and the chart does not grant shows up as a 403.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llm_autopilot.controller.certs import subject_alt_name
from tests.e2e.conftest import CHART, DRY_NS, DRY_WATCHED, ROOT, Kubectl, Operator, _free_port, listening, wait_for
from tests.e2e.helpers import NO_NAMESPACE, forbidden, one, operator_env, planned, run_helm, sa_kubeconfig

pytestmark = pytest.mark.e2e

EXAMPLES = ROOT / "examples"
RESYNC_SECONDS = 3
#: documented hand-over bounds (charts/llm-autopilot/README.md, "High availability")
HANDOVER_GRACEFUL_SECONDS = 15.0  # SIGTERM: the stopping replica deletes its keep-alive at once
#: the HA test runs with a 20 s peering lifetime (chart: peering.lifetimeSeconds, 60 by default)
PEERING_LIFETIME_SECONDS = 20
HANDOVER_CRASH_SECONDS = PEERING_LIFETIME_SECONDS + 15.0  # SIGKILL: the keep-alive expires, then the standby resumes

MODES: dict[str, list[str]] = {
    "default": [],
    "cluster": ["--set", "rbac.scope=cluster"],
    "namespaced": ["--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{','.join(DRY_WATCHED)}}}"],
    "cluster-listed": ["--set", "rbac.scope=cluster", "--set", f"watchNamespaces={{{','.join(DRY_WATCHED)}}}"],
    "webhook-cert-manager": ["--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=true"],
    "webhook-self-signed": ["--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=false"],
    "no-webhook": ["--set", "webhook.enabled=false"],
    "ha": ["--set", "replicaCount=3"],
    "ha-namespaced": ["--set", "replicaCount=2", "--set", "rbac.scope=namespaced",
                      "--set", f"watchNamespaces={{{DRY_WATCHED[0]}}}"],
    "ha-cluster-scope-listed": ["--set", "replicaCount=2", "--set", f"watchNamespaces={{{DRY_WATCHED[0]}}}"],
    "webhook-cert-manager-issuer": ["--set", "webhook.certManager.enabled=true",
                                    "--set", "webhook.certManager.issuerRef.name=corp-ca",
                                    "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer"],
    "network-policy": ["--set", "networkPolicy.enabled=true"],
    "network-policy-no-monitoring": ["--set", "networkPolicy.enabled=true", "--set", "webhook.enabled=false",
                                     "--set", "networkPolicy.monitoringNamespaceSelector=null"],
    "monitoring": ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.vllmPodMonitor.enabled=true",
                   "--set", "monitoring.prometheusRule.enabled=true",
                   "--set", "monitoring.grafanaDashboard.enabled=true"],
}

# ---- The reviewed RBAC: what the operator really uses (found by running it with the chart's token). ----
Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # (apiGroups, resources, verbs)
SECRETS_RULE: Rule = (("",), ("secrets",), ("get",))  # Hub token (rbac.readSecrets), in watched namespaces only
NAMESPACED_RULES: list[Rule] = [
    (("llm-autopilot.io",), ("llmdeployments",), ("get", "list", "watch", "patch")),  # Kopf watch + metadata
    (("llm-autopilot.io",), ("llmdeployments/status",), ("patch",)),
    # ownerReferences with blockOwnerDeletion (OwnerReferencesPermissionEnforcement admission)
    (("llm-autopilot.io",), ("llmdeployments/finalizers",), ("update",)),
    (("apps",), ("deployments",), ("get", "list", "watch", "create", "patch")),  # SSA creates need create
    # watched (the operator's indexes); get: before writing one the watch does not show up to date
    (("",), ("services",), ("get", "list", "watch", "create", "patch")),
    (("policy",), ("poddisruptionbudgets",), ("get", "list", "watch", "create", "patch")),
    (("apps",), ("statefulsets",), ("get", "create", "patch")),  # replicas across nodes, one group each
    (("leaderworkerset.x-k8s.io",), ("leaderworkersets",), ("get", "create", "patch")),  # when its CRD exists
    (("keda.sh",), ("scaledobjects",), ("get", "create", "patch")),  # spec.autoscaling
    # networkPolicy.enabled: one per LLMDeployment; get and delete: one left from before goes once the switch is off
    (("networking.k8s.io",), ("networkpolicies",), ("get", "create", "patch", "delete")),
    (("",), ("persistentvolumeclaims",), ("get", "create", "patch")),  # spec.model.cache: applied once
    (("batch",), ("jobs",), ("get", "create", "patch")),  # spec.model.cache: the download Job
    (("",), ("pods",), ("list", "watch")),  # crash evidence, from the pod watch
    (("",), ("pods/log",), ("get",)),  # the previous container's log: vLLM's root cause of a crash
    (("",), ("pods/status",), ("patch",)),  # spec.verification.burnIn: the pods' readiness gate
    SECRETS_RULE,
    (("",), ("events",), ("create",)),
]
CLUSTER_RULES: list[Rule] = [
    (("",), ("nodes",), ("list", "watch")),  # GPU labels and allocatable GPUs, from the node watch
    # Kopf's resource observer; get: is the LeaderWorkerSet (or KEDA's ScaledObject) CRD installed
    (("apiextensions.k8s.io",), ("customresourcedefinitions",), ("get", "list", "watch")),
]
NAMESPACES_RULE: Rule = (("",), ("namespaces",), ("list", "watch"))  # Kopf, when namespaces are listed
# the webhook: may the requesting user read the Secrets a spec names (controller/access.py)
SAR_RULE: Rule = (("authorization.k8s.io",), ("subjectaccessreviews",), ("create",))
CLUSTER_PEERING_RULE: Rule = (("kopf.dev",), ("clusterkopfpeerings",), ("list", "watch", "patch"))
PEERING_RULE: Rule = (("kopf.dev",), ("kopfpeerings",), ("list", "watch", "patch"))


# ----------------------------------------------------------------------------------------------------------
# fixtures and helpers
# ----------------------------------------------------------------------------------------------------------
def render(helm: Path, *values: str, release: str = "la", namespace: str = DRY_NS) -> list[dict[str, Any]]:
    out = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *values).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


#: the chart's Role (and RoleBinding) for the KV calibration store, in the release's namespace
CALIBRATION_ROLE = "la-llm-autopilot-calibration"


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return one([d for d in docs if d["metadata"]["name"] == name], kind)


def rules_of(obj: dict[str, Any]) -> list[Rule]:
    return [(tuple(r.get("apiGroups", [])), tuple(r.get("resources", [])), tuple(r.get("verbs", [])))
            for r in obj["rules"]]


def example(name: str, new_name: str | None = None) -> str:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    if new_name:
        doc["metadata"]["name"] = new_name
    return yaml.safe_dump(doc)


@pytest.fixture
def release(chart_cluster: Kubectl, helm: Path, namespace: str) -> Iterator[str]:
    """The chart installed with `helm install` into the test namespace, watching only that namespace.

    The in-cluster webhook Service is unreachable on this cluster (no kube-proxy: the API server reaches
    webhooks only by URL), so the chart's ValidatingWebhookConfiguration selects no namespace here and the tests
    register the same configuration with a loopback URL instead; the webhook's RBAC is the chart's.
    """
    name = f"la-{namespace.removeprefix('e2e-')}"
    run_helm(helm, "install", name, str(CHART), "--namespace", namespace, "--wait=false",
             "--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{namespace}}}",
             "--set", "peering.enabled=true", "--set", f"webhook.namespaceSelector.matchLabels.{NO_NAMESPACE}",
             env=chart_cluster.env)
    yield name
    run_helm(helm, "uninstall", name, "--namespace", namespace, env=chart_cluster.env, check=False)


# ----------------------------------------------------------------------------------------------------------
# offline: lint, render, schema, reviewed RBAC, CRD copy, alerts, dashboard
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(MODES))
def test_lint(helm: Path, mode: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *MODES[mode])
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("mode", list(MODES))
def test_every_rendered_manifest_passes_server_dry_run(chart_cluster: Kubectl, helm: Path, mode: str) -> None:
    docs = render(helm, *MODES[mode])
    result = chart_cluster("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs), result.stdout


def test_modes_render_what_they_promise(helm: Path) -> None:
    default = render(helm)
    assert kinds(default) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Role", "RoleBinding", "Secret",
                              "Secret", "Service", "Service", "ServiceAccount", "ValidatingWebhookConfiguration"]
    pod = one(default, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["llm-autopilot", "operator", "--liveness=http://0.0.0.0:8080/healthz",
                                    "--log-format=json", "--standalone"]
    assert container["image"] == "ghcr.io/llm-autopilot/llm-autopilot:0.1.0"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    # ready only once the admission server listens, so the webhook Service never routes to a refusing pod
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    no_webhook = one(render(helm, *MODES["no-webhook"]), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert no_webhook["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"healthz": 8080, "metrics": 9090,
                                                                           "webhook": 9443}
    env = {e["name"]: e.get("value") for e in container["env"]}
    calibration_ns = next(e for e in container["env"] if e["name"] == "LLM_AUTOPILOT_CALIBRATION_NAMESPACE")
    assert calibration_ns["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["LLM_AUTOPILOT_METRICS_PORT"] == "9090" and env["LLM_AUTOPILOT_WEBHOOK_MANAGED"] == "false"
    assert env["LLM_AUTOPILOT_WEBHOOK_ADDR"] == "0.0.0.0" and env["LLM_AUTOPILOT_WEBHOOK_PORT"] == "9443"
    assert env["LLM_AUTOPILOT_PROMETHEUS_TLS_VERIFY"] == "true"
    # `--set tlsVerify=false` gives a boolean: accepted, and the operator reads the string "false"
    for value in ("false", "/etc/prometheus/ca.crt"):
        deployment = one(render(helm, "--set", f"operator.prometheus.tlsVerify={value}"), "Deployment")
        container_env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {e["name"]: e.get("value") for e in container_env}["LLM_AUTOPILOT_PROMETHEUS_TLS_VERIFY"] == value

    # self-signed webhook TLS: the Secret's CA is the caBundle the API server trusts
    secret = named(default, "Secret", "la-llm-autopilot-webhook-tls")
    vwc = one(default, "ValidatingWebhookConfiguration")
    hook = vwc["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["clientConfig"]["service"]["path"] == "/validate-llmdeployment"
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"

    cm = render(helm, *MODES["webhook-cert-manager"])
    assert {"Certificate", "Issuer"} <= set(kinds(cm))
    assert [d["metadata"]["name"] for d in cm if d["kind"] == "Secret"] == ["la-llm-autopilot-key"]  # no TLS one

    # the operator's key (calibration samples, status sections): made once by the chart, or the one named
    key_secret = named(default, "Secret", "la-llm-autopilot-key")
    assert key_secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert len(base64.b64decode(key_secret["data"]["key"])) == 64
    key_env = {e["name"]: e for e in container["env"]}["LLM_AUTOPILOT_CALIBRATION_KEY"]
    assert key_env["valueFrom"] == {"secretKeyRef": {"name": "la-llm-autopilot-key", "key": "key"}}
    own = render(helm, "--set", "operator.calibrationKeySecret.name=mine",
                 "--set", "operator.calibrationKeySecret.key=k")
    assert [d["metadata"]["name"] for d in own if d["kind"] == "Secret"] == ["la-llm-autopilot-webhook-tls"]
    own_env = {e["name"]: e for e in one(own, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert own_env["LLM_AUTOPILOT_CALIBRATION_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "mine", "key": "k"}}
    cm_hook = one(cm, "ValidatingWebhookConfiguration")
    assert cm_hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{DRY_NS}/la-llm-autopilot-webhook"
    assert "caBundle" not in cm_hook["webhooks"][0]["clientConfig"]

    ha = render(helm, *MODES["ha"])
    ha_container = one(ha, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--peering" in ha_container["command"] and "--standalone" not in ha_container["command"]
    assert "--peering-lifetime=60" in ha_container["command"]
    assert one(ha, "ClusterKopfPeering")["metadata"]["name"] == "llm-autopilot"
    assert one(ha, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    ns = render(helm, *MODES["ha-namespaced"])
    assert one(ns, "KopfPeering")["metadata"]["namespace"] == DRY_WATCHED[0]
    assert f"--namespace={DRY_WATCHED[0]}" in one(ns, "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "command"]
    assert one(ns, "ValidatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"][0][
        "values"] == [DRY_WATCHED[0]]

    monitoring = render(helm, *MODES["monitoring"])
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= set(kinds(monitoring))
    podmonitor = one(monitoring, "PodMonitor")
    assert podmonitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm",
                                                             "app.kubernetes.io/managed-by": "llm-autopilot"}
    assert podmonitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert podmonitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert one(monitoring, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "replicaCount=-1"], "at '/replicaCount': minimum: got -1, want 1"),
    (["--set", "replicaCount=two"], "at '/replicaCount'"),
    (["--set", "rbac.scope=foo"], "at '/rbac/scope': value must be one of 'cluster', 'namespaced'"),
    (["--set", "rbac.scope=namespaced"], "at '/watchNamespaces': minItems: got 0, want 1"),
    (["--set", "webhook.failurePolicy=Sometimes"], "at '/webhook/failurePolicy'"),
    (["--set", "webhook.timeoutSeconds=60"], "at '/webhook/timeoutSeconds': maximum: got 60, want 30"),
    (["--set", "watchNamespaces={Bad_Name}"], "at '/watchNamespaces/0'"),
    (["--set", "monitoring.prometheusRule.kvSaturationThreshold=1.5"], "kvSaturationThreshold"),
    (["--set", "operator.logFormat=xml"], "at '/operator/logFormat'"),
    (["--set", "peering.lifetimeSeconds=5"], "at '/peering/lifetimeSeconds': minimum: got 5, want 15"),
    (["--set", "unknownKey=1"], "additional properties 'unknownKey' not allowed"),
])
def test_schema_rejects_bad_values_with_a_clear_message(helm: Path, values: list[str], message: str) -> None:
    result = run_helm(helm, "template", "la", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def _no_wildcards(rules: list[Rule]) -> None:
    for groups, resources, verbs in rules:
        assert "*" not in (*groups, *resources, *verbs), (groups, resources, verbs)


def test_rbac_grants_exactly_the_reviewed_rules(helm: Path) -> None:
    # cluster mode, every namespace, standalone: one ClusterRole
    cluster = one(render(helm, *MODES["cluster"]), "ClusterRole")
    assert rules_of(cluster) == [*NAMESPACED_RULES, *CLUSTER_RULES, SAR_RULE]
    # cluster mode, HA: plus the cluster-scoped peering object
    assert rules_of(one(render(helm, *MODES["ha"]), "ClusterRole")) == [
        *NAMESPACED_RULES, CLUSTER_PEERING_RULE, *CLUSTER_RULES, SAR_RULE]
    # no webhook, no access reviews; no Secrets when told so
    assert rules_of(one(render(helm, *MODES["no-webhook"]), "ClusterRole")) == [*NAMESPACED_RULES, *CLUSTER_RULES]
    no_secrets = rules_of(one(render(helm, "--set", "rbac.readSecrets=false"), "ClusterRole"))
    assert all("secrets" not in resources for _, resources, _ in no_secrets)
    # namespaced mode: a Role per watched namespace; the ClusterRole holds cluster-scoped rules only
    docs = render(helm, *MODES["namespaced"])
    roles = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] != CALIBRATION_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(DRY_WATCHED)
    for role in roles:
        assert rules_of(role) == NAMESPACED_RULES
    assert rules_of(one(docs, "ClusterRole")) == [*CLUSTER_RULES, NAMESPACES_RULE, SAR_RULE]
    ha_docs = render(helm, *MODES["ha-namespaced"])
    assert rules_of(one([d for d in ha_docs if d["metadata"]["name"] != CALIBRATION_ROLE], "Role")) == [
        *NAMESPACED_RULES, PEERING_RULE]
    # cluster mode with listed namespaces: the namespaced rules in one ClusterRole, bound per namespace
    listed = render(helm, *MODES["cluster-listed"])
    cluster_roles = {d["metadata"]["name"]: rules_of(d) for d in listed if d["kind"] == "ClusterRole"}
    assert cluster_roles == {"la-llm-autopilot-cluster": [*CLUSTER_RULES, NAMESPACES_RULE, SAR_RULE],
                             "la-llm-autopilot-namespaced": NAMESPACED_RULES}
    bindings = {(d["metadata"].get("namespace"), d["roleRef"]["name"]) for d in listed if d["kind"].endswith("Binding")}
    assert bindings == {(None, "la-llm-autopilot-cluster"), (DRY_NS, CALIBRATION_ROLE),
                        *((ns, "la-llm-autopilot-namespaced") for ns in DRY_WATCHED)}
    ha_listed = render(helm, *MODES["ha-cluster-scope-listed"])
    assert rules_of(next(d for d in ha_listed if d["metadata"]["name"] == "la-llm-autopilot-namespaced")) == [
        *NAMESPACED_RULES, PEERING_RULE]
    for docs in (render(helm, *mode) for mode in MODES.values()):
        for obj in docs:
            if obj["kind"] in ("Role", "ClusterRole"):
                _no_wildcards(rules_of(obj))
        # the calibration store: its one ConfigMap, in the release's namespace, by name (create cannot be named)
        calibration = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == CALIBRATION_ROLE)
        assert calibration["metadata"]["namespace"] == DRY_NS
        assert calibration["rules"] == [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["llm-autopilot-calibration"],
             "verbs": ["get", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]


def _cluster_wide_rules(docs: list[dict[str, Any]]) -> list[Rule]:
    """What ClusterRoleBindings grant: effective in every namespace."""
    roles = {d["metadata"]["name"]: rules_of(d) for d in docs if d["kind"] == "ClusterRole"}
    return [rule for d in docs if d["kind"] == "ClusterRoleBinding" for rule in roles[d["roleRef"]["name"]]]


@pytest.mark.parametrize("mode", ["namespaced", "cluster-listed", "ha-namespaced", "ha-cluster-scope-listed"])
def test_listed_namespaces_grant_nothing_namespaced_outside_them(helm: Path, mode: str) -> None:
    """With watchNamespaces, Secrets (and every other namespaced right) are bound in those namespaces only (D9)."""
    docs = render(helm, *MODES[mode])
    wide = _cluster_wide_rules(docs)
    assert all("secrets" not in resources for _, resources, _ in wide), wide
    assert [r for r in wide if r not in (*CLUSTER_RULES, NAMESPACES_RULE, SAR_RULE)] == []
    watched = {ns for flag in MODES[mode] if flag.startswith("watchNamespaces=")
               for ns in flag.removeprefix("watchNamespaces={").removesuffix("}").split(",")}
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] != CALIBRATION_ROLE]
    granted = {d["metadata"]["namespace"] for d in bindings}
    assert granted == watched
    for binding in bindings:
        kind, name = binding["roleRef"]["kind"], binding["roleRef"]["name"]
        role = one([d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
                    and d["metadata"].get("namespace") in (None, binding["metadata"]["namespace"])], kind)
        assert SECRETS_RULE in rules_of(role)  # there, and only there


def test_chart_crd_is_the_generated_one() -> None:
    generated = (ROOT / "crds" / "llm-autopilot.io_llmdeployments.yaml").read_text()
    assert (CHART / "crds" / "llm-autopilot.io_llmdeployments.yaml").read_text() == generated, (
        "charts/llm-autopilot/crds/ is stale: cp crds/llm-autopilot.io_llmdeployments.yaml charts/llm-autopilot/crds/")


def test_alert_rules_are_valid_promql(helm: Path, tmp_path: Path) -> None:
    rule = one(render(helm, *MODES["monitoring"]), "PrometheusRule")
    names = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert names == ["LLMAutopilotVLLMOOMKilled", "LLMAutopilotKVCacheSaturated", "LLMAutopilotRemediationExhausted",
                     "LLMAutopilotDeploymentNotReady", "LLMAutopilotOperatorDown"]
    promtool = shutil.which("promtool")
    # the e2e tests need Prometheus anyway (Debian's package, installed by .ci/run), and it ships promtool
    assert promtool is not None, "promtool is not installed: apt-get install prometheus"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_shows_plan_kv_preemptions_restarts_remediation(helm: Path) -> None:
    cm = one(render(helm, *MODES["monitoring"]), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["llm-autopilot.json"])
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("plan", "kv-cache usage", "preemptions", "restarts", "remediation steps"):
        assert topic in titles, titles
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for metric in ("vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "kube_pod_container_status_restarts_total",
                   "llm_autopilot_remediation_steps_total", "nvidia_com_gpu"):
        assert metric in exprs


# ----------------------------------------------------------------------------------------------------------
# on the cluster: helm install, the operator with the chart's ServiceAccount, the webhook, HA
# ----------------------------------------------------------------------------------------------------------
def test_operator_with_the_charts_service_account(chart_cluster: Kubectl, helm: Path, release: str, namespace: str,
                                                  tmp_path: Path) -> None:
    kubectl = chart_cluster
    sa = f"{release}-llm-autopilot"
    assert kubectl.maybe("serviceaccount", sa, "-n", namespace) is not None
    assert kubectl.maybe("kopfpeering", "llm-autopilot", "-n", namespace) is not None
    kubeconfig = sa_kubeconfig(kubectl, namespace, sa, tmp_path / "sa.kubeconfig")
    whoami = kubectl("--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:{sa}"

    # the calibration store: its ConfigMap by name, created once; no other ConfigMap read
    def can(*args: str) -> bool:
        result = kubectl("--kubeconfig", str(kubeconfig), "auth", "can-i", *args, "-n", namespace, check=False)
        return result.stdout.strip() == "yes"

    assert can("get", "configmaps/llm-autopilot-calibration") and can("update", "configmaps/llm-autopilot-calibration")
    assert can("create", "configmaps") and not can("get", "configmaps/other") and not can("list", "configmaps")
    port = _free_port()
    # the operator reads the store on every reconcile (a GET the chart's Role allows: no Forbidden below)
    env = operator_env(kubectl, kubeconfig, LLM_AUTOPILOT_WEBHOOK="true", LLM_AUTOPILOT_WEBHOOK_PORT=str(port),
                       LLM_AUTOPILOT_WEBHOOK_CERT_DIR=str(tmp_path / "certs"), LLM_AUTOPILOT_WEBHOOK_MANAGED="false",
                       LLM_AUTOPILOT_CALIBRATION_NAMESPACE=namespace)
    # the same flags as the chart's Deployment (peering on: the release has its KopfPeering)
    op = Operator(env, tmp_path / "operator.log", ["--peering", f"--namespace={namespace}"]).start()
    vwc_name = f"{release}-loopback"
    try:
        cert = tmp_path / "certs" / "webhook.crt"
        # the certificate is written before Kopf's server binds: wait for the listener itself
        wait_for("the webhook server listening", lambda: listening(port), timeout=60)
        # the chart's ValidatingWebhookConfiguration, pointed at the loopback server instead of the Service
        vwc = one(render(helm, "--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{namespace}}}",
                         release=release, namespace=namespace), "ValidatingWebhookConfiguration")
        vwc["metadata"] = {"name": vwc_name}
        vwc["webhooks"][0]["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/validate-llmdeployment",
            "caBundle": base64.b64encode(cert.read_bytes()).decode()}
        kubectl("apply", "-f", "-", input=json.dumps(vwc))

        kubectl("apply", "-n", namespace, "-f", "-", input=example("qwen3-8b-l4.yaml"))
        wait_for("Planned=True and a Deployment, reconciled with the chart's ServiceAccount",
                 lambda: planned(kubectl, namespace, "qwen3-8b"), timeout=90)
        # a spec that names a Secret: the webhook's SubjectAccessReview (the chart grants create) lets it in
        kubectl("create", "secret", "generic", "hf-token", "--from-literal=token=hf_test", "-n", namespace)
        with_token = yaml.safe_load(example("qwen3-8b-l4.yaml", "with-token"))
        with_token["spec"]["model"]["hubTokenSecretRef"] = {"name": "hf-token"}
        admitted = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(with_token),
                           check=False)
        assert admitted.returncode == 0, admitted.stderr
        for kind in ("service", "poddisruptionbudget"):
            assert kubectl.maybe(kind, "qwen3-8b", "-n", namespace) is not None

        def rejected() -> str | bool:
            result = kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "infeasible-llama-405b.yaml"), check=False)
            return result.returncode != 0 and "denied the request" in result.stderr and result.stderr

        message = wait_for("the webhook's rejection", rejected, timeout=30)
        assert "does not fit" in message and "8 x H100-80GB" in message
        assert kubectl.maybe("llmd", "llama-405b", "-n", namespace) is None
        # a few resyncs with events, status reads and node lists
        op.wait_reconciles(namespace, "qwen3-8b", 2, since=op.mark())
        assert forbidden(op.output()) == [], "\n".join(forbidden(op.output()))
    finally:
        op.stop()
        kubectl("delete", "validatingwebhookconfiguration", vwc_name, "--ignore-not-found", check=False)
    sys.stderr.write(f"operator log: {op.log}\n")


def test_standalone_operator_with_the_charts_service_account(chart_cluster: Kubectl, helm: Path, namespace: str,
                                                             tmp_path: Path) -> None:
    """The chart's default: one replica, `--standalone`, no peering RBAC."""
    kubectl = chart_cluster
    name = f"ls-{namespace.removeprefix('e2e-')}"
    run_helm(helm, "install", name, str(CHART), "--namespace", namespace, "--wait=false",
             "--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{namespace}}}",
             "--set", "webhook.enabled=false", env=kubectl.env)
    op = None
    try:
        kubeconfig = sa_kubeconfig(kubectl, namespace, f"{name}-llm-autopilot", tmp_path / "sa.kubeconfig")
        op = Operator(operator_env(kubectl, kubeconfig), tmp_path / "operator.log",
                      ["--standalone", f"--namespace={namespace}"]).start()
        kubectl("apply", "-n", namespace, "-f", "-", input=example("qwen3-8b-l4.yaml"))
        # standalone must not need the peering CRD or its RBAC (Kopf pauses forever if given a peering name)
        wait_for("a standalone reconcile", lambda: planned(kubectl, namespace, "qwen3-8b"), timeout=45)
        assert "peering CRD is missing" not in op.output()
        assert forbidden(op.output()) == [], "\n".join(forbidden(op.output()))
    finally:
        if op:
            op.stop()
        run_helm(helm, "uninstall", name, "--namespace", namespace, env=kubectl.env, check=False)


def _resource_versions(kubectl: Kubectl, namespace: str, name: str) -> dict[str, tuple[str, int]]:
    result = {}
    for kind in ("llmd", "deployment", "service", "poddisruptionbudget"):
        meta = kubectl.json(kind, name, "-n", namespace)["metadata"]
        result[kind] = (meta["resourceVersion"], int(meta.get("generation") or 0))
    return result


def _writes(log: str) -> list[str]:
    """Writes the operator's Kubernetes client made (its urllib3 debug lines); Kopf's own are separate."""
    return [line for line in log.splitlines() if re.search(r'"(PATCH|POST|PUT|DELETE) /api', line)]


def _handover(kubectl: Kubectl, namespace: str, active: Operator, standby: Operator, sig: signal.Signals,
              new_name: str) -> float:
    start = time.monotonic()
    active.stop(sig)
    kubectl("apply", "-n", namespace, "-f", "-", input=example("qwen3-8b-l4.yaml", new_name))
    wait_for(f"the standby to reconcile {new_name} after {sig.name}", lambda: planned(kubectl, namespace, new_name),
             timeout=HANDOVER_CRASH_SECONDS + 30, interval=0.25)
    return time.monotonic() - start


def test_ha_peering_hands_over_without_duplicate_writes(chart_cluster: Kubectl, release: str, namespace: str,
                                                        tmp_path: Path) -> None:
    kubectl = chart_cluster
    kubeconfig = sa_kubeconfig(kubectl, namespace, f"{release}-llm-autopilot", tmp_path / "sa.kubeconfig")
    args = ["--peering", f"--namespace={namespace}", f"--peering-lifetime={PEERING_LIFETIME_SECONDS}"]
    # every replica's key, as the chart's Deployment gives it: the Secret the install made (the status one replica
    # attested is the others' own)
    key = base64.b64decode(kubectl.json("secret", f"{release}-llm-autopilot-key", "-n", namespace)["data"]["key"])

    def replica(name: str, priority: int) -> Operator:
        env = operator_env(kubectl, kubeconfig, POD_ID=f"{name}-{uuid.uuid4().hex[:4]}",
                           LLM_AUTOPILOT_CALIBRATION_KEY=key.decode())
        return Operator(env, tmp_path / f"{name}.log", [*args, f"--priority={priority}"])

    high, low = replica("high", 100), replica("low", 50)
    procs = [high, low]
    try:
        high.start()
        kubectl("apply", "-n", namespace, "-f", "-", input=example("qwen3-8b-l4.yaml"))
        wait_for("the active replica's reconcile", lambda: planned(kubectl, namespace, "qwen3-8b"), timeout=90)
        low.start()
        # the standby starts paused (peering is pre-activated) and stays so while it sees a higher priority
        wait_for("the standby's keep-alive", lambda: low.env["POD_ID"] in json.dumps(
            kubectl.json("kopfpeering", "llm-autopilot", "-n", namespace).get("status") or {}), timeout=60)
        # while the active replica resyncs twice, the standby (which has seen both keep-alives) stays paused
        high.wait_reconciles(namespace, "qwen3-8b", 2, since=high.mark())
        assert "Resuming operations" not in low.output(), "the standby did not pause"
        before = _resource_versions(kubectl, namespace, "qwen3-8b")
        assert _writes(low.output()) == [], "the standby wrote while paused"

        graceful = _handover(kubectl, namespace, high, low, signal.SIGTERM, "after-sigterm")
        low.wait_reconciles(namespace, "qwen3-8b", 3, since=low.mark())  # the new active replica resyncs it:
        assert _resource_versions(kubectl, namespace, "qwen3-8b") == before  # nothing may change

        high2 = replica("high2", 100)
        procs.append(high2)
        high2.start()
        wait_for("the standby to pause again for the higher priority",
                 lambda: "Pausing operations in favour of" in low.output(), timeout=60)
        high2.wait_reconciles(namespace, "qwen3-8b", 2, since=0)  # high2 is active before it is killed
        crash = _handover(kubectl, namespace, high2, low, signal.SIGKILL, "after-sigkill")
        low.wait_reconciles(namespace, "qwen3-8b", 3, since=low.mark())
        assert _resource_versions(kubectl, namespace, "qwen3-8b") == before

        # one field manager per object: nobody but `llm-autopilot` applied the workload
        live = kubectl.json("deployment", "qwen3-8b", "-n", namespace, "--show-managed-fields")
        managers = {m["manager"] for m in live["metadata"]["managedFields"] if m["operation"] == "Apply"}
        assert managers == {"llm-autopilot"}
        sys.stderr.write(f"HA hand-over: SIGTERM {graceful:.1f}s, SIGKILL {crash:.1f}s "
                         f"(bounds {HANDOVER_GRACEFUL_SECONDS}s / {HANDOVER_CRASH_SECONDS}s)\n")
        assert graceful < HANDOVER_GRACEFUL_SECONDS
        assert crash < HANDOVER_CRASH_SECONDS
        for proc in procs:
            assert forbidden(proc.output()) == [], "\n".join(forbidden(proc.output()))
    finally:
        for proc in procs:
            proc.stop(signal.SIGKILL)


def test_self_signed_webhook_certificate_survives_upgrades(chart_cluster: Kubectl, helm: Path, namespace: str) -> None:
    """genCA/genSignedCert run once: `helm upgrade` reuses the Secret (lookup), so the caBundle never drifts."""
    kubectl = chart_cluster
    name = f"lw-{namespace.removeprefix('e2e-')}"
    # namespaced: the webhook (unreachable here, failurePolicy Fail) only selects this test's namespace
    values = ["--set", "rbac.scope=namespaced", "--set", f"watchNamespaces={{{namespace}}}"]
    secret_name, vwc_name = f"{name}-llm-autopilot-webhook-tls", f"{name}-llm-autopilot"
    try:
        run_helm(helm, "install", name, str(CHART), "--namespace", namespace, "--wait=false", *values, env=kubectl.env)
        first = kubectl.json("secret", secret_name, "-n", namespace)["data"]
        bundle = kubectl.json("validatingwebhookconfiguration", vwc_name)["webhooks"][0]["clientConfig"]["caBundle"]
        assert bundle == first["ca.crt"]
        run_helm(helm, "upgrade", name, str(CHART), "--namespace", namespace, "--wait=false", *values,
                 "--set", "operator.resyncSeconds=30", env=kubectl.env)
        assert kubectl.json("secret", secret_name, "-n", namespace)["data"] == first
        vwc = kubectl.json("validatingwebhookconfiguration", vwc_name)
        assert vwc["webhooks"][0]["clientConfig"]["caBundle"] == first["ca.crt"]
        # rotation (chart README): delete the Secret, upgrade: a new CA and certificate, and a pod restart
        template = kubectl.json("deployment", f"{name}-llm-autopilot", "-n", namespace)["spec"]["template"]
        kubectl("delete", "secret", secret_name, "-n", namespace)
        run_helm(helm, "upgrade", name, str(CHART), "--namespace", namespace, "--wait=false", *values,
                 "--set", "operator.resyncSeconds=30", env=kubectl.env)
        rotated = kubectl.json("secret", secret_name, "-n", namespace)["data"]
        assert rotated["ca.crt"] != first["ca.crt"]
        vwc = kubectl.json("validatingwebhookconfiguration", vwc_name)
        assert vwc["webhooks"][0]["clientConfig"]["caBundle"] == rotated["ca.crt"]
        new_template = kubectl.json("deployment", f"{name}-llm-autopilot", "-n", namespace)["spec"]["template"]
        checksum = "checksum/webhook-tls"
        assert new_template["metadata"]["annotations"][checksum] != template["metadata"]["annotations"][checksum]
    finally:
        run_helm(helm, "uninstall", name, "--namespace", namespace, env=kubectl.env, check=False)


KeyAndCert = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def _issue(ca: KeyAndCert | None, common_name: str, hosts: list[str]) -> KeyAndCert:
    """(key, certificate): a CA when `ca` is None, else a serving certificate for `hosts` signed by it."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer_key, issuer = (key, subject) if ca is None else (ca[0], ca[1].subject)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True))
    if ca is not None:
        sans = x509.SubjectAlternativeName([subject_alt_name(h) for h in hosts])
        builder = builder.add_extension(sans, critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def _mount_secret(directory: Path, version: str, files: dict[str, bytes]) -> None:
    """Write `files` the way the kubelet updates a mounted Secret: a new timestamped directory, then one
    atomic swap of the `..data` symlink that the visible names point through."""
    target = directory / f"..{version}"
    target.mkdir(parents=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(Path("..data") / name)
    swap = directory / "..data_tmp"
    swap.symlink_to(target.name)
    swap.replace(directory / "..data")


def test_operator_serves_a_renewed_webhook_certificate_without_restart(kubectl: Kubectl, helm: Path, namespace: str,
                                                                       tmp_path: Path) -> None:
    """cert-manager renews the Secret, the kubelet swaps the mounted files: the operator serves the new
    certificate (and the API server, trusting the unchanged CA, keeps calling it) with no restart."""
    def pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> dict[str, bytes]:
        return {"tls.key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()),
                "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
                "ca.crt": ca[1].public_bytes(serialization.Encoding.PEM)}

    ca = _issue(None, "llm-autopilot-test-ca", [])
    first = _issue(ca, "llm-autopilot-webhook", ["127.0.0.1", "localhost"])
    renewed = _issue(ca, "llm-autopilot-webhook", ["127.0.0.1", "localhost"])
    tls = tmp_path / "webhook-tls"
    _mount_secret(tls, "v1", pem(*first))

    port = _free_port()

    def served() -> x509.Certificate:
        return x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", port)).encode())

    # the chart's settings: mounted files, the chart ships the webhook configuration (not Kopf)
    env = operator_env(kubectl, Path(kubectl.env["KUBECONFIG"]), LLM_AUTOPILOT_WEBHOOK="true",
                       LLM_AUTOPILOT_WEBHOOK_PORT=str(port), LLM_AUTOPILOT_WEBHOOK_MANAGED="false",
                       LLM_AUTOPILOT_WEBHOOK_CERT_FILE=str(tls / "tls.crt"),
                       LLM_AUTOPILOT_WEBHOOK_KEY_FILE=str(tls / "tls.key"),
                       LLM_AUTOPILOT_WEBHOOK_CA_FILE=str(tls / "ca.crt"),
                       LLM_AUTOPILOT_WEBHOOK_CERT_CHECK_SECONDS="1")
    op = Operator(env, tmp_path / "operator.log", ["--standalone", f"--namespace={namespace}"]).start()
    vwc_name = f"rotation-{namespace}"
    try:
        wait_for("the webhook server listening", lambda: listening(port), timeout=60)
        assert served() == first[1]
        # the chart's ValidatingWebhookConfiguration with the CA as caBundle, for this namespace only
        vwc = one(render(helm), "ValidatingWebhookConfiguration")
        vwc["metadata"] = {"name": vwc_name}
        hook = vwc["webhooks"][0]
        hook["name"] = "rotation.llm-autopilot.io"
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate-llmdeployment",
                                "caBundle": base64.b64encode(pem(*first)["ca.crt"]).decode()}
        kubectl("apply", "-f", "-", input=json.dumps(vwc))

        def admitted() -> bool:
            # failurePolicy Fail: admitted only if the API server reached the operator over TLS it trusts
            result = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                             input=example("qwen3-8b-l4.yaml"), check=False)
            assert "x509" not in result.stderr, result.stderr
            return result.returncode == 0

        wait_for("the first certificate trusted by the API server", admitted, timeout=30)

        _mount_secret(tls, "v2", pem(*renewed))
        wait_for("the renewed certificate served", lambda: served() == renewed[1], timeout=30)
        assert op.process is not None and op.process.poll() is None, "the operator restarted"
        wait_for("the renewed certificate trusted by the API server", admitted, timeout=30)
        infeasible = str(EXAMPLES / "infeasible-llama-405b.yaml")
        denied = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", infeasible, check=False)
        assert denied.returncode != 0 and "denied the request" in denied.stderr, denied.stderr
    finally:
        op.stop()
        kubectl("delete", "validatingwebhookconfiguration", vwc_name, "--ignore-not-found", check=False)
