{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "zonewatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name when it already contains the chart name. */}}
{{- define "zonewatch.fullname" -}}
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

{{- define "zonewatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: immutable on the DaemonSet/Deployment, so name and instance only. */}}
{{- define "zonewatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zonewatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "zonewatch.labels" -}}
helm.sh/chart: {{ include "zonewatch.chart" . }}
{{ include "zonewatch.selectorLabels" . }}
app.kubernetes.io/component: exporter
app.kubernetes.io/part-of: zonewatch
{{- with .Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "zonewatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "zonewatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "zonewatch.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
Relay mode: one replica follows every node's flows through Hubble Relay. It
is a Deployment, never a DaemonSet, or each flow would be counted once per
node; the node-local sources (GPU, conntrack) are off in it.
*/}}
{{- define "zonewatch.relay" -}}
{{- if and .Values.hubble.enabled .Values.hubble.relay.enabled }}true{{ end }}
{{- end }}

{{/* Which sources this workload runs ("true" or empty). */}}
{{- define "zonewatch.hubbleSocket" -}}
{{- if and .Values.hubble.enabled (not .Values.hubble.relay.enabled) (ne .Values.hubble.access "tls") }}true{{ end }}
{{- end }}
{{- define "zonewatch.hubbleNodeTLS" -}}
{{- if and .Values.hubble.enabled (not .Values.hubble.relay.enabled) (eq .Values.hubble.access "tls") }}true{{ end }}
{{- end }}
{{- define "zonewatch.gpu" -}}
{{- if and (ne .Values.gpu.source "none") (not (include "zonewatch.relay" .)) }}true{{ end }}
{{- end }}
{{- define "zonewatch.podResources" -}}
{{- if and (include "zonewatch.gpu" .) .Values.gpu.podResources.enabled }}true{{ end }}
{{- end }}
{{- define "zonewatch.conntrack" -}}
{{- if and .Values.conntrack.enabled (not (include "zonewatch.relay" .)) }}true{{ end }}
{{- end }}
{{- define "zonewatch.ipcache" -}}
{{- if and .Values.ipcache.enabled (not (include "zonewatch.relay" .)) }}true{{ end }}
{{- end }}
{{/* The host's BPF filesystem is mounted (read-only) for either BPF source. */}}
{{- define "zonewatch.bpffs" -}}
{{- if or (include "zonewatch.conntrack" .) (include "zonewatch.ipcache" .) }}true{{ end }}
{{- end }}

{{/*
Root is needed to open sockets and pinned maps owned by root on the host:
the kubelet PodResources socket, Cilium's pinned BPF maps (mode 0600: the
conntrack and ipcache sources), and
the Hubble socket unless hubble.socketGroup names a group that may use it.
Root here holds no capability beyond those listed in zonewatch.capabilities.
*/}}
{{- define "zonewatch.needsRoot" -}}
{{- if or (include "zonewatch.podResources" .) (include "zonewatch.bpffs" .) (and (include "zonewatch.hubbleSocket" .) (kindIs "invalid" .Values.hubble.socketGroup)) }}true{{ end }}
{{- end }}

{{/* Capabilities added back after drop ALL, per enabled source (see values.yaml). */}}
{{- define "zonewatch.capabilities" -}}
{{- $caps := list }}
{{- if include "zonewatch.bpffs" . }}
{{- $caps = append $caps "BPF" }}
{{- if .Values.conntrack.sysAdmin }}
{{- $caps = append $caps "SYS_ADMIN" }}
{{- end }}
{{- end }}
{{- with .Values.securityContext.capabilities }}
{{- range .add }}
{{- $caps = append $caps . }}
{{- end }}
{{- end }}
{{- toJson ($caps | uniq) }}
{{- end }}

{{/* The pod securityContext: computed user and groups, overridden by .Values.podSecurityContext. */}}
{{- define "zonewatch.podSecurityContext" -}}
{{- $ctx := dict }}
{{- if include "zonewatch.needsRoot" . }}
{{- $_ := set $ctx "runAsUser" 0 }}
{{- $_ := set $ctx "runAsGroup" 0 }}
{{- $_ := set $ctx "runAsNonRoot" false }}
{{- else }}
{{- $_ := set $ctx "runAsUser" 65534 }}
{{- $_ := set $ctx "runAsGroup" 65534 }}
{{- $_ := set $ctx "runAsNonRoot" true }}
{{- end }}
{{- if and (include "zonewatch.hubbleSocket" .) (not (kindIs "invalid" .Values.hubble.socketGroup)) }}
{{- $_ := set $ctx "supplementalGroups" (list (int64 .Values.hubble.socketGroup)) }}
{{- end }}
{{- $ctx = mergeOverwrite $ctx (deepCopy (.Values.podSecurityContext | default dict)) }}
{{- toYaml $ctx }}
{{- end }}

{{/* The container securityContext: drop ALL, add back what the sources need. */}}
{{- define "zonewatch.securityContext" -}}
{{- $ctx := deepCopy (.Values.securityContext | default dict) }}
{{- $caps := include "zonewatch.capabilities" . | fromJsonArray }}
{{- $c := dict "drop" (list "ALL") }}
{{- if $caps }}
{{- $_ := set $c "add" $caps }}
{{- end }}
{{- $_ := set $ctx "capabilities" $c }}
{{- toYaml $ctx }}
{{- end }}

{{/* The web config is on when given inline or as an existing Secret. */}}
{{- define "zonewatch.webConfigSecret" -}}
{{- if .Values.webConfig.existingSecret }}
{{- .Values.webConfig.existingSecret }}
{{- else if .Values.webConfig.config }}
{{- printf "%s-web-config" (include "zonewatch.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "zonewatch.scheme" -}}
{{- if and (include "zonewatch.webConfigSecret" .) .Values.webConfig.tls }}https{{ else }}http{{ end }}
{{- end }}

{{/*
One scrape endpoint, shared by the PodMonitor and the ServiceMonitor.
honorLabels: the exporter's namespace and pod labels name the training job's
pods, not the exporter's; Prometheus must keep them. The job label is set
to .Values.scrape.job, which the rules select (rules.selector).
*/}}
{{- define "zonewatch.endpoint" -}}
port: metrics
path: {{ .Values.scrape.path }}
scheme: {{ include "zonewatch.scheme" . }}
honorLabels: true
{{- with .Values.scrape.interval }}
interval: {{ . }}
{{- end }}
{{- with .Values.scrape.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- with .Values.scrape.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.scrape.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  {{- /* node: per-node alerts carry it (ExporterDown has nothing else to
  name the node by), so a node-down alert can inhibit them. */}}
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  - action: replace
    targetLabel: job
    replacement: {{ required "scrape.job must be set" .Values.scrape.job }}
  {{- with .Values.scrape.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.scrape.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
