{{/* Names and labels shared by every object. */}}

{{- define "kai.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kai.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
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

{{- define "kai.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.global.imageRegistry -}}
{{- printf "%s/%s:%s" .Values.global.imageRegistry .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The vgpu mount without a trailing slash. */}}
{{- define "kai.mount" -}}
{{- .Values.paths.containerVgpuMount | trimSuffix "/" -}}
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

{{- define "kai.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
