{{/* Names and labels shared by every object. */}}

{{- define "kai.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /*
This chart's values.yaml, as data (files/values-defaults.yaml is a link to
it: templates cannot read values.yaml itself).
*/ -}}
{{- define "kai.chartDefaults" -}}
{{- .Files.Get "files/values-defaults.yaml" -}}
{{- end -}}

{{- /*
Values that are not this chart's, made whole (issue 43). `helm upgrade
--reuse-values` renders with the previous release's values in place of
values.yaml (Helm reuses the old chart's defaults, not the new one's): from a
Go chart release, every key only this chart has would be missing and the
templates would stop at the first (`nil pointer evaluating ...
isolation.nodeGuard`). Five sections exist only in this chart's values.yaml
(libraryDelivery, csi, priorityClassQuota, observability, networkPolicy):
values that lack any of them (`--set` may have given some) get every key of
values.yaml they lack, recursively, while their own keys win (false and
empty ones too): what `helm upgrade -f <Go values file>` renders. Values
with all five are left as Helm made them (a key set to null stays
removed). Every template includes this first; the work is done once per
render.
*/ -}}
{{- define "kai.values" -}}
{{- if not (hasKey .Values "_kaiValues") -}}
{{- $_ := set .Values "_kaiValues" true -}}
{{- $foreign := false -}}
{{- range list "libraryDelivery" "csi" "priorityClassQuota" "observability" "networkPolicy" -}}
{{- if not (hasKey $.Values .) -}}{{- $foreign = true -}}{{- end -}}
{{- end -}}
{{- if $foreign -}}
{{- $defaults := include "kai.chartDefaults" . | fromYaml -}}
{{- if not $defaults.libraryDelivery -}}
{{- fail "these values are not this chart's (helm upgrade --reuse-values from another chart?) and files/values-defaults.yaml, this chart's defaults, is missing" -}}
{{- end -}}
{{- include "kai.fillDefaults" (dict "dst" .Values "src" $defaults) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kai.fillDefaults" -}}
{{- $dst := .dst -}}
{{- range $k, $v := .src -}}
{{- if not (hasKey $dst $k) -}}
{{- $_ := set $dst $k $v -}}
{{- else if and (kindIs "map" $v) (kindIs "map" (get $dst $k)) -}}
{{- include "kai.fillDefaults" (dict "dst" (get $dst $k) "src" $v) -}}
{{- end -}}
{{- end -}}
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

{{/*
Registry precedence as in the Go chart: global.imageRegistry, then
image.registry. The Go chart's own image (projecthami/kai-resource-isolator,
its values.yaml default, so in every Go values file and in what `helm
upgrade --reuse-values` reuses from a Go release) has none of our binaries:
its registry, repository and tag give way to this chart's defaults.
*/}}
{{- define "kai.image" -}}
{{- $image := .Values.image -}}
{{- if hasSuffix "projecthami/kai-resource-isolator" (toString $image.repository) -}}
{{- $image = (include "kai.chartDefaults" . | fromYaml).image -}}
{{- end -}}
{{- $tag := $image.tag | default .Chart.AppVersion -}}
{{- $registry := .Values.global.imageRegistry | default $image.registry -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) $image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
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

{{- /*
Taking over a release of the Go chart, and giving it back (issue 43;
docs/migration.md, "Moving a Go chart release in place"). What both charts
create under the same name must work for either chart's revision, since
`helm rollback` restores the other's objects without running any hook:

- workload selectors (immutable): kai.keptSelector keeps the one the object
  has (the Go chart's component kai-libsync / kai-webhook), so the Go
  revision's DaemonSet and Deployment apply over ours and ours over theirs;
- the webhook's Secret: the Go chart's certgen Job made
  <fullname>-webhook-tls (Opaque; ca, tls.crt, tls.key; no Helm metadata).
  It is never touched: the Go revision's pods mount it after a rollback.
  This chart's Secret is then <fullname>-webhook-cert, holding a copy of it;
- the caBundle: certgen patched it into the Go configuration's entry
  mutate.kai-resource-isolator.io, outside any manifest. While that entry
  has the CA of certgen's Secret, this chart names its entry the same and
  leaves its caBundle out, so neither an upgrade nor a rollback (client-side
  three-way merge or server-side apply) removes it; both charts' pods serve
  the certgen certificate, which it verifies. Once the Secret is gone (no
  rollback wanted), the entries take this chart's names again with its own
  caBundle: a new value in certgen's entry would be a server-side apply
  conflict with certgen's field manager, a renamed entry is not;
- new paths: the Go webhook serves /mutate only. While pods of a webhook
  that is not ours are in the Deployment's ReplicaSets, the configuration
  has the /mutate entry alone, for every namespace (kai.webhookTransitional).

lookup finds nothing under `helm template` and client-side dry runs: the
fresh-install objects are rendered then.
*/ -}}

{{- /* The object's Helm release annotations name this release. */ -}}
{{- define "kai.ownedByRelease" -}}
{{- $a := dig "metadata" "annotations" dict (.obj | default dict) -}}
{{- if and (eq (toString (get $a "meta.helm.sh/release-name")) .root.Release.Name) (eq (toString (get $a "meta.helm.sh/release-namespace")) .root.Release.Namespace) -}}true{{- end -}}
{{- end -}}

{{- /*
The matchLabels a DaemonSet or Deployment <fullname>-<name> already has in
the cluster, else ours (component `component`); YAML.
*/ -}}
{{- define "kai.keptSelector" -}}
{{- $live := lookup "apps/v1" .kind (include "kai.namespace" .root) (printf "%s-%s" (include "kai.fullname" .root) .name) | default dict -}}
{{- $kept := dig "spec" "selector" "matchLabels" dict $live -}}
{{- if and $kept (not (dig "spec" "selector" "matchExpressions" list $live)) -}}
{{- toYaml $kept -}}
{{- else -}}
{{- include "kai.selector" (dict "root" .root "component" .component) -}}
{{- end -}}
{{- end -}}

{{- /* The webhook's pods: the Deployment's selector, its Service's, PDB's and NetworkPolicy's. */ -}}
{{- define "kai.webhookSelector" -}}
{{- include "kai.keptSelector" (dict "root" . "kind" "Deployment" "name" "webhook" "component" "webhook") -}}
{{- end -}}

{{- /*
The webhook's TLS, as JSON: {"secret": name, "crt", "key", "ca": base64,
"goEntry": the live Go entry's name or "", "keepCaBundle": name the /mutate
entry goEntry and leave its caBundle out of the manifest}. Computed once per
render.
*/ -}}
{{- define "kai.webhookTls" -}}
{{- if not (hasKey .Values "_kaiWebhookTls") -}}
{{- $ns := include "kai.namespace" . -}}
{{- $full := include "kai.fullname" . -}}
{{- $plainName := printf "%s-webhook-tls" $full -}}
{{- $altName := printf "%s-webhook-cert" $full -}}
{{- $plain := lookup "v1" "Secret" $ns $plainName | default dict -}}
{{- $alt := lookup "v1" "Secret" $ns $altName | default dict -}}
{{- $plainOurs := include "kai.ownedByRelease" (dict "root" . "obj" $plain) -}}
{{- $altOurs := include "kai.ownedByRelease" (dict "root" . "obj" $alt) -}}
{{- /* Made by someone else: not Helm's (for this release), not cert-manager's: the Go chart's certgen. */ -}}
{{- $certgen := false -}}
{{- if and $plain (not $plainOurs) (not (hasKey (dig "metadata" "annotations" dict $plain) "cert-manager.io/certificate-name")) -}}
{{- $certgen = true -}}
{{- end -}}
{{- $name := ternary $altName $plainName (or (eq $altOurs "true") $certgen) -}}
{{- $own := ternary $alt $plain (eq $name $altName) -}}
{{- $ownData := dict -}}
{{- if and (or (and (eq $name $altName) $altOurs) (and (eq $name $plainName) $plainOurs)) $own.data -}}
{{- if and (hasKey $own.data "tls.crt") (hasKey $own.data "tls.key") (hasKey $own.data "ca.crt") -}}
{{- $ownData = dict "crt" (index $own.data "tls.crt") "key" (index $own.data "tls.key") "ca" (index $own.data "ca.crt") -}}
{{- end -}}
{{- end -}}
{{- $certgenData := dict -}}
{{- if and $certgen $plain.data -}}
{{- if and (hasKey $plain.data "tls.crt") (hasKey $plain.data "tls.key") (hasKey $plain.data "ca") -}}
{{- $certgenData = dict "crt" (index $plain.data "tls.crt") "key" (index $plain.data "tls.key") "ca" (index $plain.data "ca") -}}
{{- end -}}
{{- end -}}
{{- /* The Go configuration's entry, and the caBundle certgen gave it. */ -}}
{{- $goEntry := "" -}}{{- $liveCa := "" -}}
{{- $mwc := lookup "admissionregistration.k8s.io/v1" "MutatingWebhookConfiguration" "" (printf "%s-mutating" $full) | default dict -}}
{{- range (dig "webhooks" list $mwc) -}}
{{- if eq (toString .name) "mutate.kai-resource-isolator.io" -}}
{{- $goEntry = .name -}}
{{- $liveCa = dig "clientConfig" "caBundle" "" . | toString -}}
{{- end -}}
{{- end -}}
{{- $out := dict "secret" $name "goEntry" $goEntry "keepCaBundle" false -}}
{{- if and $goEntry $certgenData (eq $liveCa (toString $certgenData.ca)) -}}
{{- /* Serve the certificate the caBundle certgen wrote verifies, and leave that caBundle alone. */ -}}
{{- $out = merge (dict "keepCaBundle" true) $certgenData $out -}}
{{- else if $ownData -}}
{{- $out = merge $ownData $out -}}
{{- else if $certgenData -}}
{{- $out = merge $certgenData $out -}}
{{- else -}}
{{- $service := include "kai.webhookService" . -}}
{{- $dns := list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.cluster.local" $service $ns) -}}
{{- $genCA := genCA (printf "%s-ca" $service) (int .Values.tls.validityDays) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service $ns) nil $dns (int .Values.tls.validityDays) $genCA -}}
{{- $out = merge (dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($genCA.Cert | b64enc)) $out -}}
{{- end -}}
{{- $_ := set .Values "_kaiWebhookTls" $out -}}
{{- end -}}
{{- toJson (get .Values "_kaiWebhookTls") -}}
{{- end -}}

{{- define "kai.webhookSecret" -}}
{{- (include "kai.webhookTls" . | fromJson).secret -}}
{{- end -}}

{{- /*
"true" while the webhook Deployment still has pods of a webhook that is not
this chart's (a ReplicaSet of it with replicas whose `webhook` container does
not run /bin/kai-webhook: the Go chart's, during the upgrade from it). Those
serve /mutate only, so the configuration then sends every namespace there,
opt-out ones included (their pods are capped, not refused or let through);
the /mutate/allow-opt-out entry comes with the next upgrade after the
rollout (NOTES say so).
*/ -}}
{{- define "kai.webhookTransitional" -}}
{{- $deployment := printf "%s-webhook" (include "kai.fullname" .) -}}
{{- $foreign := false -}}
{{- range (dig "items" list (lookup "apps/v1" "ReplicaSet" (include "kai.namespace" .) "" | default dict)) -}}
{{- $owned := false -}}
{{- range (dig "metadata" "ownerReferences" list .) -}}
{{- if and (eq (toString .kind) "Deployment") (eq (toString .name) $deployment) -}}{{- $owned = true -}}{{- end -}}
{{- end -}}
{{- if and $owned (or (gt (int (dig "spec" "replicas" 0 .)) 0) (gt (int (dig "status" "replicas" 0 .)) 0)) -}}
{{- $ours := false -}}
{{- range (dig "spec" "template" "spec" "containers" list .) -}}
{{- if and (eq (toString .name) "webhook") (hasSuffix "kai-webhook" (toString (first (.command | default (list ""))))) -}}{{- $ours = true -}}{{- end -}}
{{- end -}}
{{- if not $ours -}}{{- $foreign = true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if $foreign -}}true{{- end -}}
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

{{/*
Pod labels of a component plus the user's (webhook/librarySync/monitor
.podLabels); `selector` (the workload's, kai.keptSelector) wins, so the pods
always match the selector their DaemonSet or Deployment has.
*/}}
{{- define "kai.podLabels" -}}
{{- $labels := include "kai.labels" .root | fromYaml -}}
{{- $_ := set $labels "app.kubernetes.io/component" .component -}}
{{- $_ := set $labels "kai-resource-isolator.io/webhook" "ignore" -}}
{{- range $k, $v := .extra | default dict -}}{{- $_ := set $labels $k $v -}}{{- end -}}
{{- range $k, $v := .selector | default dict -}}{{- $_ := set $labels $k $v -}}{{- end -}}
{{- toYaml $labels -}}
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
{{- if and $m.enabled $m.isolation.nodeGuard (or $m.isolation.events (eq (toString $m.isolation.enforce) "evict") (include "kai.dra" .)) (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}true{{- end -}}
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
{{- $kai := "has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations)" -}}
{{- if include "kai.dra" . -}}
{{- /* Pods with DRA claims too: only the webhook can tell, by reading the
claims, whether one is of a GPU-memory class (docs/dra.md). */ -}}
{{- $kai = printf "(%s) || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)" $kai -}}
{{- end -}}
{{- $conditions = append $conditions (dict "name" "kai-gpu-sharing-pods" "expression" $kai) -}}
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

{{- /*
DRA consumable-capacity GPU shares (docs/dra.md): on where classes are listed,
the node agent runs (monitor.enabled: it holds each cap to the allocation and
writes the limits a claim leaves to the node; without it such pods would wait
for ever) and the API server serves resource.k8s.io/v1 (Kubernetes 1.34+; the
webhook and the agent read that version only). A release stored before the value
existed (helm upgrade --reuse-values) has no dra key: off.
*/ -}}
{{- define "kai.dra" -}}
{{- if and (.Values.dra | default dict).deviceClasses .Values.monitor.enabled (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version) (.Capabilities.APIVersions.Has "resource.k8s.io/v1") -}}true{{- end -}}
{{- end -}}

{{- /* The webhook's and the agent's --dra-memory-class flags, one per class. */ -}}
{{- define "kai.draArgs" -}}
{{- if include "kai.dra" . -}}
{{- range .Values.dra.deviceClasses }}
- --dra-memory-class={{ .name }}={{ .memoryCapacity }}
{{- end }}
{{- end -}}
{{- end -}}
