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

{{/*
Labels common to all objects; our own pods carry the webhook's ignore label.
part-of is fixed, unlike name (nameOverride): kubectl vgpu finds the
aggregator Service by it (AGGREGATOR_SELECTOR in services/kubectl-vgpu).
*/}}
{{- define "kai.labels" -}}
app.kubernetes.io/name: {{ include "kai.name" . }}
app.kubernetes.io/part-of: kai-resource-isolator
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

{{- /* The aggregator checks callers' tokens (monitor.aggregator.auth.mode kubernetes). */ -}}
{{- define "kai.aggregatorAuth" -}}
{{- if eq (toString .Values.monitor.aggregator.auth.mode) "kubernetes" -}}true{{- end -}}
{{- end -}}

{{- /* The aggregator's /metrics needs a token (mode kubernetes, metrics rbac). */ -}}
{{- define "kai.aggregatorMetricsAuth" -}}
{{- if and (include "kai.aggregatorAuth" .) (eq (toString .Values.monitor.aggregator.auth.metrics) "rbac") -}}true{{- end -}}
{{- end -}}

{{- /* The agents' /metrics needs a token (monitor.agent.auth.metrics rbac). */ -}}
{{- define "kai.agentMetricsAuth" -}}
{{- if eq (toString .Values.monitor.agent.auth.metrics) "rbac" -}}true{{- end -}}
{{- end -}}

{{- /*
The node agent's /metrics port. monitor.metricsPort is the Go chart's key,
and there it was the monitor DaemonSet's (the agent's) port, so it keeps that
meaning; monitor.nodeMetricsPort, ours, wins when set.
*/ -}}
{{- define "kai.nodeMetricsPort" -}}
{{- int (default .Values.monitor.metricsPort .Values.monitor.nodeMetricsPort) -}}
{{- end -}}

{{- /*
The aggregator's HTTP port (/metrics, the API, the web view). values.yaml
gives it, but `helm upgrade --reuse-values` from a release made before the
key existed reuses that release's values, where it is missing: without this
default the aggregator would listen on "0.0.0.0:" and its Service and
NetworkPolicy would name no port.
*/ -}}
{{- define "kai.aggregatorHttpPort" -}}
{{- int (default 9394 .Values.monitor.aggregator.httpPort) -}}
{{- end -}}

{{- define "kai.grpcTlsOn" -}}
{{- if and .Values.monitor.enabled .Values.monitor.grpcTls.enabled -}}true{{- end -}}
{{- end -}}

{{- /*
The gRPC mutual-TLS material (monitor.grpcTls), as JSON:
{"node": {Secret data}, "aggregator": {Secret data}}. Two CAs, so that
neither side's key can act as the other: agents serve "kai-node-agent"
(issued by the agents' CA) and accept clients of the aggregator's CA only;
the aggregator presents "kai-aggregator" (issued by the aggregator's CA) and
trusts the agents' CA only. Each Secret's ca.crt is the CA its holder checks
the peer against. No CA key is kept. Both Secrets are reused when both exist
(helm lookup), else both are generated anew (first install, an upgrade from
the single-certificate layout, a rotation: delete either Secret). Computed
once per render and kept under .Values, so the Secrets and the pods'
checksum annotations agree.
*/ -}}
{{- define "kai.grpcTlsData" -}}
{{- if not (hasKey .Values "_kaiGrpcTls") -}}
{{- $ns := include "kai.namespace" . -}}
{{- $node := lookup "v1" "Secret" $ns (printf "%s-node-grpc-tls" (include "kai.fullname" .)) -}}
{{- $agg := lookup "v1" "Secret" $ns (printf "%s-aggregator-grpc-tls" (include "kai.fullname" .)) -}}
{{- $keys := list "tls.crt" "tls.key" "ca.crt" -}}
{{- $reuse := and $node $agg $node.data $agg.data -}}
{{- range $keys -}}
{{- if $reuse -}}{{- $reuse = and (hasKey $node.data .) (hasKey $agg.data .) -}}{{- end -}}
{{- end -}}
{{- $data := dict -}}
{{- if $reuse -}}
{{- $data = dict "node" (pick $node.data "tls.crt" "tls.key" "ca.crt") "aggregator" (pick $agg.data "tls.crt" "tls.key" "ca.crt") -}}
{{- else -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $nodeCA := genCA "kai-node-agent-ca" $days -}}
{{- $aggCA := genCA "kai-aggregator-ca" $days -}}
{{- $nodeCert := genSignedCert "kai-node-agent" nil (list "kai-node-agent") $days $nodeCA -}}
{{- $aggCert := genSignedCert "kai-aggregator" nil (list "kai-aggregator") $days $aggCA -}}
{{- $data = dict
  "node" (dict "tls.crt" ($nodeCert.Cert | b64enc) "tls.key" ($nodeCert.Key | b64enc) "ca.crt" ($aggCA.Cert | b64enc))
  "aggregator" (dict "tls.crt" ($aggCert.Cert | b64enc) "tls.key" ($aggCert.Key | b64enc) "ca.crt" ($nodeCA.Cert | b64enc)) -}}
{{- end -}}
{{- $_ := set .Values "_kaiGrpcTls" $data -}}
{{- end -}}
{{- toJson (get .Values "_kaiGrpcTls") -}}
{{- end -}}

{{- /* Pod annotation: a new certificate pair rolls the pods (the CA files are read at start). */ -}}
{{- define "kai.grpcTlsChecksum" -}}
{{- include "kai.grpcTlsData" . | sha256sum -}}
{{- end -}}
