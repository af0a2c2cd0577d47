{{/*
Names. Everything here is a pure function of the values and the release: no random values, no
`lookup`, no time, so `helm template` renders the same bytes every time (Argo CD stays Synced).
*/}}

{{- define "primus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "primus.fullname" -}}
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

{{/* A component's name: FULLNAME-COMPONENT, within 63 characters. */}}
{{- define "primus.componentName" -}}
{{- $full := include "primus.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-" }}
{{- printf "%s-%s" $full .component }}
{{- end }}

{{- define "primus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "primus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "primus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "primus.labels" -}}
helm.sh/chart: {{ include "primus.chart" . }}
{{ include "primus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: primus-projection
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component: (dict "root" $ "component" "operator") */}}
{{- define "primus.componentLabels" -}}
{{ include "primus.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "primus.componentSelectorLabels" -}}
{{ include "primus.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "primus.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "primus.benchImage" -}}
{{- if .Values.benchmark.image.repository }}
{{- printf "%s:%s" .Values.benchmark.image.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.benchmark.image.tag) }}
{{- else }}
{{- include "primus.image" . }}
{{- end }}
{{- end }}

{{- define "primus.operator.serviceAccountName" -}}
{{- default (include "primus.componentName" (dict "root" . "component" "operator")) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "primus.webhook.serviceAccountName" -}}
{{- default (include "primus.componentName" (dict "root" . "component" "webhook")) .Values.webhook.serviceAccount.name }}
{{- end }}

{{- define "primus.bench.serviceAccountName" -}}
{{- default (include "primus.componentName" (dict "root" . "component" "benchmark")) .Values.benchmark.serviceAccount.name }}
{{- end }}

{{- define "primus.operator.leaseName" -}}
{{- default (include "primus.componentName" (dict "root" . "component" "operator")) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{/* The Secret holding the operator's benchmark-report key (in the release namespace). */}}
{{- define "primus.operator.reportKeySecret" -}}
{{- default (include "primus.componentName" (dict "root" . "component" "operator-report-key")) .Values.operator.reportKeySecret }}
{{- end }}

{{/* The Secret of the agent's endpoint: the user's, or the chart's when it has an endpoint. */}}
{{- define "primus.operator.agentSecret" -}}
{{- if .Values.operator.agent.existingSecret -}}
{{- .Values.operator.agent.existingSecret -}}
{{- else if .Values.operator.agent.endpoint -}}
{{- include "primus.componentName" (dict "root" . "component" "operator-agent") -}}
{{- end -}}
{{- end }}

{{/* The ValidatingWebhookConfiguration's name (cluster-scoped: the release name keeps it unique). */}}
{{- define "primus.webhook.configurationName" -}}
{{- include "primus.fullname" . }}
{{- end }}

{{- define "primus.webhook.serviceName" -}}
{{- include "primus.componentName" (dict "root" . "component" "webhook") }}
{{- end }}

{{- define "primus.webhook.certificateName" -}}
{{- include "primus.componentName" (dict "root" . "component" "webhook-tls") }}
{{- end }}

{{- define "primus.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.tls.mode "secret" }}
{{- .Values.webhook.tls.secret.name }}
{{- else }}
{{- include "primus.componentName" (dict "root" . "component" "webhook-tls") }}
{{- end }}
{{- end }}

{{/* Webhook replicas: the value, else 2. */}}
{{- define "primus.webhook.replicas" -}}
{{- if kindIs "invalid" .Values.webhook.replicas }}2{{ else }}{{ .Values.webhook.replicas }}{{ end }}
{{- end }}

{{/* The Secret of self-signed mode: the webhook's CA and serving certificate, shared by the replicas. */}}
{{- define "primus.webhook.certSecretName" -}}
{{- include "primus.componentName" (dict "root" . "component" "webhook-certs") }}
{{- end }}

{{/*
PodDisruptionBudget API version: policy/v1 where the cluster serves it (Kubernetes >= 1.21),
policy/v1beta1 before. A plain `helm template` knows no kinds, so the version decides there.
*/}}
{{- define "primus.pdb.apiVersion" -}}
{{- if .Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget" -}}
policy/v1
{{- else if .Capabilities.APIVersions.Has "policy/v1beta1/PodDisruptionBudget" -}}
policy/v1beta1
{{- else if semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end }}
{{- end }}

{{/* "true" when the cluster serves monitoring.coreos.com/v1 KIND (or the group version). */}}
{{- define "primus.hasMonitoring" -}}
{{- if or (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) (.root.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ end }}
{{- end }}

{{/* Tri-state switch: (dict "root" $ "value" .Values.x.enabled "kind" "ServiceMonitor") -> "true" or "". */}}
{{- define "primus.monitoringEnabled" -}}
{{- if eq (toString .value) "true" }}true
{{- else if eq (toString .value) "auto" }}{{ include "primus.hasMonitoring" . }}
{{- end }}
{{- end }}

{{/* matchConditions: GA in 1.30, beta and on by default from 1.28. */}}
{{- define "primus.webhook.matchConditions" -}}
{{- $v := toString .Values.webhook.matchConditions.enabled }}
{{- if eq $v "true" }}true
{{- else if and (eq $v "auto") (semverCompare ">=1.28-0" .Capabilities.KubeVersion.Version) }}true
{{- end }}
{{- end }}

{{/* Pod placement shared by both deployments: (dict "root" $ "values" .Values.operator "component" "operator") */}}
{{- define "primus.placement" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "primus.componentSelectorLabels" (dict "root" .root "component" .component) | nindent 14 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "primus.hasExtraProfiles" -}}
{{- if or .Values.extraProfiles.hardware .Values.extraProfiles.models }}true{{ end }}
{{- end }}

{{/* The extra-profiles volume (keys hardware.FILE / models.FILE mapped to hardware/FILE, models/FILE). */}}
{{- define "primus.profilesVolume" -}}
- name: profiles
  configMap:
    name: {{ include "primus.componentName" (dict "root" . "component" "profiles") }}
    items:
      {{- range $file, $_ := .Values.extraProfiles.hardware }}
      - key: hardware.{{ $file }}
        path: hardware/{{ $file }}
      {{- end }}
      {{- range $file, $_ := .Values.extraProfiles.models }}
      - key: models.{{ $file }}
        path: models/{{ $file }}
      {{- end }}
{{- end }}
