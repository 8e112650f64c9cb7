{{/* Names and labels shared by every object. */}}

{{- define "kai.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix; 40 characters leave room for our suffixes. */}}
{{- define "kai.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespace of every namespaced object (Go chart: namespaceOverride). */}}
{{- define "kai.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels common to all objects; our own pods carry the webhook's ignore label. */}}
{{- define "kai.labels" -}}
app.kubernetes.io/name: {{ include "kai.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kai.selector" -}}
app.kubernetes.io/name: {{ include "kai.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Registry precedence as in the Go chart: global.imageRegistry, then image.registry. */}}
{{- define "kai.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- $registry := .Values.global.imageRegistry | default .Values.image.registry -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The vgpu directory as workloads see it, without a trailing slash. */}}
{{- define "kai.mount" -}}
{{- .Values.paths.containerVgpuMount | trimSuffix "/" -}}
{{- end -}}

{{/*
The vgpu directory on the host: <paths.hostInstallBase>/vgpu, or the
container path when hostInstallBase is empty. libsync installs there, the
agent reads there, and the webhook mounts it into workloads at kai.mount.
*/}}
{{- define "kai.hostDir" -}}
{{- with .Values.paths.hostInstallBase -}}
{{- printf "%s/vgpu" (trimSuffix "/" .) -}}
{{- else -}}
{{- include "kai.mount" . -}}
{{- end -}}
{{- end -}}

{{- /*
libraryDelivery is csi: the webhook mounts one CSI volume of kai.csiDriver,
the node DaemonSet runs the kai-csi plugin that serves it.
*/ -}}
{{- define "kai.csi" -}}
{{- if eq (toString .Values.libraryDelivery) "csi" -}}true{{- end -}}
{{- end -}}

{{- /*
The CSI driver's name: the CSIDriver object's, the plugin's and the webhook's
default (--csi-driver). Cluster-wide, like the webhook itself.
*/ -}}
{{- define "kai.csiDriver" -}}
vgpu.kai-resource-isolator.io
{{- end -}}

{{/*
A PodDisruptionBudget availability value as the Go chart accepts it: a
non-negative integer or a percentage; anything else is "" (unusable).
*/}}
{{- define "kai.availability" -}}
{{- if or (kindIs "int" .) (kindIs "int64" .) (kindIs "float64" .) -}}
{{- if ge (int .) 0 -}}{{ int . }}{{- end -}}
{{- else if kindIs "string" . -}}
{{- if regexMatch "^[0-9]+%$" . -}}{{ . }}{{- else if regexMatch "^[0-9]+$" . -}}{{ . }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* A Go duration ("5s", "500ms", "1m", "1h") in milliseconds; "" if unparsable. */}}
{{- define "kai.durationMs" -}}
{{- $d := toString . -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- $m := regexFindAll "^([0-9]+)(ms|s|m|h)$" $d 1 -}}
{{- if $m -}}
{{- $unit := regexReplaceAll "^[0-9]+" $d "" -}}
{{- $n := regexReplaceAll "[a-z]+$" $d "" -}}
{{- mul (atoi $n) (get $units $unit) -}}
{{- end -}}
{{- end -}}

{{- define "kai.webhookService" -}}
{{- printf "%s-webhook" (include "kai.fullname" .) -}}
{{- end -}}

{{- define "kai.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "kai.fullname" .) -}}
{{- end -}}

{{/* Hardened container security context; `root` for libsync and the agent. */}}
{{- define "kai.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
capabilities:
  drop: ["ALL"]
  {{- with .add }}
  add: {{ toJson . }}
  {{- end }}
{{- if .root }}
runAsUser: 0
runAsNonRoot: false
{{- else }}
runAsUser: 65532
runAsGroup: 65532
runAsNonRoot: true
{{- end }}
{{- end -}}

{{/* global.imagePullSecrets (Go chart) and image.pullSecrets, merged. */}}
{{- define "kai.imagePullSecrets" -}}
{{- $secrets := concat (.Values.global.imagePullSecrets | default list) (.Values.image.pullSecrets | default list) | uniq -}}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod labels of a component plus the user's (webhook/librarySync/monitor .podLabels). */}}
{{- define "kai.podLabels" -}}
{{- include "kai.labels" .root }}
app.kubernetes.io/component: {{ .component }}
kai-resource-isolator.io/webhook: ignore
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The ServiceMonitor API exists (as the Go chart checks, so installs without the Prometheus Operator work). */}}
{{- define "kai.serviceMonitorApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" -}}true{{- end -}}
{{- end -}}

{{- /*
The node guard (docs/security.md): on when asked for, where the agent writes
Events or evicts, and where ServiceAccount tokens carry the node's name
(1.30+: ServiceAccountTokenPodNodeInfo) and matchConditions exist.
*/ -}}
{{- define "kai.nodeGuard" -}}
{{- $m := .Values.monitor -}}
{{- if and $m.enabled $m.isolation.nodeGuard (or $m.isolation.events (eq (toString $m.isolation.enforce) "evict")) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
{{- end -}}

{{- /* matchConditions: beta and on by default in 1.28, GA in 1.30. */ -}}
{{- define "kai.matchConditionsSupported" -}}
{{- if semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}

{{- /* The chart's condition plus the user's; empty without API support. */ -}}
{{- define "kai.webhookMatchConditions" -}}
{{- if include "kai.matchConditionsSupported" . -}}
{{- $conditions := list -}}
{{- if .Values.webhook.scopeToSharingPods -}}
{{- $conditions = append $conditions (dict "name" "kai-gpu-sharing-pods" "expression" "has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)") -}}
{{- end -}}
{{- $conditions = concat $conditions (.Values.webhook.matchConditions | default list) -}}
{{- if $conditions -}}{{- toYaml $conditions -}}{{- end -}}
{{- end -}}
{{- end -}}

{{- /*
"" = fail closed only where the chart's condition keeps every other pod away
from the webhook; otherwise fail open, the behaviour before matchConditions.
*/ -}}
{{- define "kai.webhookFailurePolicy" -}}
{{- if .Values.webhook.failurePolicy -}}
{{- .Values.webhook.failurePolicy -}}
{{- else if and .Values.webhook.scopeToSharingPods (include "kai.matchConditionsSupported" .) -}}
Fail
{{- else -}}
Ignore
{{- end -}}
{{- end -}}
