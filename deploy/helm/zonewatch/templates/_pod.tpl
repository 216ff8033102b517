{{/*
The exporter pod, shared by the DaemonSet (one per node, the default) and
the Relay-mode Deployment (one replica).
*/}}
{{- define "zonewatch.podTemplate" -}}
{{- $relay := include "zonewatch.relay" . }}
{{- $webSecret := include "zonewatch.webConfigSecret" . }}
metadata:
  labels:
    {{- include "zonewatch.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: exporter
    {{- with .zonewatchShard }}
    zonewatch.io/shard: {{ .index | quote }}
    {{- end }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "zonewatch.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "zonewatch.podSecurityContext" . | nindent 4 }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  containers:
    - name: exporter
      image: {{ include "zonewatch.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --web.listen-address=:{{ .Values.port }}
        - --web.telemetry-path={{ .Values.scrape.path }}
        - --log.level={{ .Values.log.level }}
        - --log.format={{ .Values.log.format }}
        {{- if $relay }}
        # Relay mode: every node's jobs and flows from one replica.
        - --node-name=
        {{- with .zonewatchShard }}
        - --shard={{ .index }}
        - --total-shards={{ .total }}
        {{- end }}
        {{- end }}
        {{- with .Values.kube.resync }}
        - --kube.resync={{ . }}
        {{- end }}
        {{- range .Values.kube.jobRules }}
        - --kube.job-rule={{ . }}
        {{- end }}
        {{- if not .Values.kube.services }}
        - --no-kube.services.enabled
        {{- end }}
        {{- if not .Values.fence.enabled }}
        - --no-fence.enabled
        {{- end }}
        {{- if not .Values.hubble.enabled }}
        - --no-hubble.enabled
        {{- else }}
        - --hubble.enabled
        {{- if $relay }}
        - --hubble.address={{ required "hubble.relay.address must be set in Relay mode" .Values.hubble.relay.address }}
        {{- if .zonewatchShard }}
        - --hubble.cluster-name={{ .Values.hubble.relay.clusterName | default "default" }}
        {{- end }}
        {{- with .Values.hubble.relay.tls }}
        {{- if .enabled }}
        - --hubble.tls
        {{- if .existingSecret }}
        - --hubble.tls.ca-file=/etc/zonewatch/hubble-tls/ca.crt
        {{- if .clientCert }}
        - --hubble.tls.cert-file=/etc/zonewatch/hubble-tls/tls.crt
        - --hubble.tls.key-file=/etc/zonewatch/hubble-tls/tls.key
        {{- end }}
        {{- end }}
        {{- with .serverName }}
        - --hubble.tls.server-name={{ . }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- else if include "zonewatch.hubbleNodeTLS" . }}
        # The node's own Hubble server over TLS: nothing of the agent's mounted.
        - --hubble.address=$(HOST_IP):{{ .Values.hubble.nodeTLS.port }}
        - --hubble.tls
        - --hubble.tls.ca-file=/etc/zonewatch/hubble-tls/ca.crt
        - --hubble.tls.cert-file=/etc/zonewatch/hubble-tls/tls.crt
        - --hubble.tls.key-file=/etc/zonewatch/hubble-tls/tls.key
        - --hubble.tls.server-name=$(NODE_NAME).{{ .Values.hubble.nodeTLS.clusterName }}.hubble-grpc.cilium.io
        {{- else }}
        - --hubble.address=unix://{{ .Values.hubble.socketDir }}/{{ .Values.hubble.socketName }}
        {{- end }}
        - --hubble.series-grace={{ .Values.hubble.seriesGrace }}
        {{- end }}
        {{- if include "zonewatch.gpu" . }}
        - --gpu.source={{ .Values.gpu.source }}
        - --gpu.interval={{ .Values.gpu.interval }}
        {{- with .Values.gpu.dcgmExporterURL }}
        - --gpu.dcgm-exporter-url={{ . }}
        {{- end }}
        {{- range .Values.gpu.dcgmExporterSelectors }}
        - --gpu.dcgm-exporter-selector={{ . }}
        {{- end }}
        {{- if include "zonewatch.podResources" . }}
        - --gpu.podresources-socket={{ .Values.gpu.podResources.hostPath }}/kubelet.sock
        {{- else }}
        - --gpu.podresources-socket=
        {{- end }}
        {{- range .Values.gpu.resourceNames }}
        - --gpu.resource-name={{ . }}
        {{- end }}
        {{- else }}
        - --gpu.source=none
        {{- end }}
        {{- if include "zonewatch.conntrack" . }}
        - --conntrack.enabled
        - --conntrack.bpffs-path={{ .Values.conntrack.bpffsHostPath }}/{{ .Values.conntrack.mapsSubPath }}
        - --conntrack.poll-interval={{ .Values.conntrack.pollInterval }}
        - --conntrack.layout={{ .Values.conntrack.layout }}
        {{- else }}
        - --no-conntrack.enabled
        {{- end }}
        {{- if include "zonewatch.ipcache" . }}
        - --ipcache.bpffs-path={{ .Values.conntrack.bpffsHostPath }}/{{ .Values.conntrack.mapsSubPath }}
        - --ipcache.refresh-interval={{ .Values.ipcache.refreshInterval }}
        - --kube.node-view={{ .Values.kube.nodeView }}
        {{- else if not $relay }}
        # No ipcache: every job pod of the cluster is watched to place remote addresses.
        - --kube.pod-view=cluster
        {{- end }}
        {{- if not .Values.bpfConfine }}
        - --no-bpf.confine
        {{- end }}
        {{- if .Values.probe.enabled }}
        - --probe.listen-address=:{{ .Values.probe.port }}
        - --probe.port={{ .Values.probe.port }}
        - --probe.peer-selector=app.kubernetes.io/name={{ include "zonewatch.name" . }},app.kubernetes.io/instance={{ .Release.Name }}
        - --probe.peers-per-zone={{ .Values.probe.peersPerZone }}
        - --probe.interval={{ .Values.probe.interval }}
        {{- else }}
        - --no-probe.enabled
        {{- end }}
        {{- if $webSecret }}
        - --web.config.file=/etc/zonewatch/web/web-config.yml
        {{- end }}
        {{- range .Values.extraArgs }}
        - {{ . }}
        {{- end }}
      env:
        {{- if not $relay }}
        # The exporter only exports job pods on its own node.
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        # For gpu.dcgmExporterURL=http://$(HOST_IP):9400/metrics (a dcgm-exporter with hostNetwork).
        - name: HOST_IP
          valueFrom:
            fieldRef:
              fieldPath: status.hostIP
        {{- end }}
        # The Go runtime collects harder as it nears the container's memory limit instead of being killed.
        - name: GOMEMLIMIT
          valueFrom:
            resourceFieldRef:
              resource: limits.memory
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.port }}
          protocol: TCP
        {{- if .Values.probe.enabled }}
        - name: probe
          containerPort: {{ .Values.probe.port }}
          protocol: TCP
        {{- end }}
      {{- $probe := dict "scheme" (include "zonewatch.scheme" . | upper) "port" "metrics" }}
      {{- if and $webSecret .Values.webConfig.basicAuth }}
      # Basic auth guards every path and the kubelet cannot log in: probe the port only.
      livenessProbe:
        tcpSocket:
          port: metrics
        {{- with .Values.livenessProbe }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      readinessProbe:
        tcpSocket:
          port: metrics
        {{- with .Values.readinessProbe }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- else }}
      livenessProbe:
        httpGet:
          path: /healthz
          {{- toYaml $probe | nindent 10 }}
        {{- with .Values.livenessProbe }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      # Ready once the Kubernetes informers synced and the ipcache was read once; GET /readyz names any source that is down (zonewatch_source_up 0), which does not make the pod unready.
      readinessProbe:
        httpGet:
          path: /readyz
          {{- toYaml $probe | nindent 10 }}
        {{- with .Values.readinessProbe }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "zonewatch.securityContext" . | nindent 8 }}
      volumeMounts:
        {{- if include "zonewatch.hubbleSocket" . }}
        - name: hubble-socket
          mountPath: {{ .Values.hubble.socketDir }}
          readOnly: true
        {{- end }}
        {{- if include "zonewatch.podResources" . }}
        - name: pod-resources
          mountPath: {{ .Values.gpu.podResources.hostPath }}
          readOnly: true
        {{- end }}
        {{- if include "zonewatch.bpffs" . }}
        - name: bpffs
          mountPath: {{ .Values.conntrack.bpffsHostPath }}
          readOnly: true
          mountPropagation: HostToContainer
        {{- end }}
        {{- if or (and $relay .Values.hubble.relay.tls.enabled .Values.hubble.relay.tls.existingSecret) (include "zonewatch.hubbleNodeTLS" .) }}
        - name: hubble-tls
          mountPath: /etc/zonewatch/hubble-tls
          readOnly: true
        {{- end }}
        {{- if $webSecret }}
        - name: web-config
          mountPath: /etc/zonewatch/web
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    {{- if include "zonewatch.hubbleSocket" . }}
    # The folder, not the socket: Cilium recreates the socket when its agent restarts. OrCreate: the pod starts before Cilium and reports the source down until the socket appears.
    - name: hubble-socket
      hostPath:
        path: {{ .Values.hubble.socketDir }}
        type: DirectoryOrCreate
    {{- end }}
    {{- if include "zonewatch.podResources" . }}
    - name: pod-resources
      hostPath:
        path: {{ .Values.gpu.podResources.hostPath }}
        type: Directory
    {{- end }}
    {{- if include "zonewatch.bpffs" . }}
    # Read by the conntrack and ipcache sources, each on its own switch.
    - name: bpffs
      hostPath:
        path: {{ .Values.conntrack.bpffsHostPath }}
        type: Directory
    {{- end }}
    {{- if and $relay .Values.hubble.relay.tls.enabled .Values.hubble.relay.tls.existingSecret }}
    - name: hubble-tls
      secret:
        secretName: {{ .Values.hubble.relay.tls.existingSecret }}
    {{- else if include "zonewatch.hubbleNodeTLS" . }}
    - name: hubble-tls
      secret:
        secretName: {{ required "hubble.access=tls needs hubble.nodeTLS.existingSecret (ca.crt, tls.crt, tls.key)" .Values.hubble.nodeTLS.existingSecret }}
    {{- end }}
    {{- if $webSecret }}
    - name: web-config
      secret:
        secretName: {{ $webSecret }}
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ternary .Values.hubble.relay.tolerations .Values.tolerations (eq $relay "true") }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
