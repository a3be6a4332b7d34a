{{/* Names */}}
{{- define "llm-autopilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llm-autopilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llm-autopilot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llm-autopilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-autopilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "llm-autopilot.labels" -}}
helm.sh/chart: {{ include "llm-autopilot.chart" . }}
{{ include "llm-autopilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llm-autopilot
{{- end }}

{{- define "llm-autopilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "llm-autopilot.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llm-autopilot.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Peering is on when asked, or automatically with more than one replica. */}}
{{- define "llm-autopilot.peering" -}}
{{- $p := .Values.peering.enabled }}
{{- if or (eq (toString $p) "true") (and (eq (toString $p) "auto") (gt (int .Values.replicaCount) 1)) }}true{{ end }}
{{- end }}

{{/* The operator watches everything when no namespace is listed (Kopf: clusterwide, ClusterKopfPeering). */}}
{{- define "llm-autopilot.clusterwide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{- define "llm-autopilot.webhookService" -}}
{{- printf "%s-webhook" (include "llm-autopilot.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding the operator's key: operator.calibrationKeySecret, or the one the chart makes. */}}
{{- define "llm-autopilot.keySecret" -}}
{{- .Values.operator.calibrationKeySecret.name | default (printf "%s-key" (include "llm-autopilot.fullname" .)) }}
{{- end }}

{{- define "llm-autopilot.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "llm-autopilot.fullname" .) }}
{{- end }}

{{/*
Self-signed webhook certificate material {ca, crt, key} (base64 PEM), generated once per render and memoized
in a private map so that the Secret, the ValidatingWebhookConfiguration's caBundle and the pod's checksum
agree. Reused from the live Secret on upgrades (lookup), so `helm upgrade` never rotates it by itself.
*/}}
{{- define "llm-autopilot.webhookCerts" -}}
{{- $memo := .Values.webhook.selfSigned }}
{{- if not (hasKey $memo "_generated") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "llm-autopilot.webhookSecret" .) }}
{{- if and $secret $secret.data (hasKey $secret.data "ca.crt") (hasKey $secret.data "tls.crt") (hasKey $secret.data "tls.key") }}
{{- $_ := set $memo "_generated" (dict "ca" (index $secret.data "ca.crt") "crt" (index $secret.data "tls.crt") "key" (index $secret.data "tls.key")) }}
{{- else }}
{{- $svc := include "llm-autopilot.webhookService" . }}
{{- $ns := .Release.Namespace }}
{{- $days := int .Values.webhook.selfSigned.validityDays }}
{{- $ca := genCA (printf "%s-webhook-ca" (include "llm-autopilot.fullname" .)) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca }}
{{- $_ := set $memo "_generated" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) }}
{{- end }}
{{- end }}
{{- toYaml (get $memo "_generated") }}
{{- end }}

{{/* Rules the operator needs in every namespace it watches (reviewed list: tests/e2e/test_chart.py). */}}
{{- define "llm-autopilot.namespacedRules" -}}
- apiGroups: [llm-autopilot.io]
  resources: [llmdeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [llm-autopilot.io]
  resources: [llmdeployments/status]
  verbs: [patch]
- apiGroups: [llm-autopilot.io]
  resources: [llmdeployments/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, create, patch]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, create, patch]
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, create, patch]
# each LLMDeployment's NetworkPolicy (networkPolicy.enabled); read and deleted once the switch is off again
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/log]
  verbs: [get]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
{{- if .Values.rbac.readSecrets }}
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/*
Cluster-scoped rules: GPU nodes for the planner; CRDs (and namespaces, when a list is watched) for Kopf; with the
webhook, SubjectAccessReviews: it asks whether the requesting user may read the Secrets a spec names.
*/}}
{{- define "llm-autopilot.clusterRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- if .Values.webhook.enabled }}
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
{{- end }}
{{- end }}

{{/*
The NetworkPolicy peers (networkPolicy.enabled): the monitoring peer (Prometheus), empty when
monitoringNamespaceSelector is null; the operator's own pods (its namespace and selector labels), which every
model's policy admits on vLLM's port (verification, burn-in, runtime LoRA updates).
*/}}
{{- define "llm-autopilot.monitoringPeer" -}}
{{- with .Values.networkPolicy }}
{{- if not (kindIs "invalid" .monitoringNamespaceSelector) }}
{{- dict "namespaceSelector" .monitoringNamespaceSelector "podSelector" (.monitoringPodSelector | default dict) | toJson }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llm-autopilot.operatorPeer" -}}
{{- $ns := dict "matchLabels" (dict "kubernetes.io/metadata.name" .Release.Namespace) }}
{{- $pods := dict "matchLabels" (include "llm-autopilot.selectorLabels" . | fromYaml) }}
{{- dict "namespaceSelector" $ns "podSelector" $pods | toJson }}
{{- end }}
