{{/* Names, labels and the settings both apps share. */}}

{{- define "txnwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "txnwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "txnwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "txnwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "txnwatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "txnwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "txnwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The collector's image: txnwatch without Spark (the Dockerfile's `collector` target). */}}
{{- define "txnwatch.collectorImage" -}}
{{- printf "%s:%s" .Values.collector.image.repository (default .Chart.AppVersion .Values.collector.image.tag) -}}
{{- end -}}

{{/* A Prometheus duration of the values' form (30s, 1m, 500ms, 1h) in milliseconds, to compare two of them. */}}
{{- define "txnwatch.durationMs" -}}
{{- $unit := regexFind "(ms|s|m|h)$" . -}}
{{- $n := int64 (trimSuffix $unit .) -}}
{{- $perUnit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- mul $n (get $perUnit $unit) -}}
{{- end -}}

{{/*
How long the job keeps an open transaction no collector sweep confirmed (TXNWATCH_STREAM__EXPIRE_AFTER_MS): a multiple
of the collector's interval unless set. Shorter than two intervals, one late sweep would forget every open candidate
(RESOLVED) and the next would report it again (OPENED): the render fails instead.
*/}}
{{- define "txnwatch.expireAfterMs" -}}
{{- $intervalMs := mulf .Values.collector.intervalSeconds 1000.0 -}}
{{- $expireMs := .Values.job.expireAfterMs -}}
{{- if kindIs "invalid" $expireMs -}}
{{- $expireMs = ceil (mulf $intervalMs .Values.job.expireAfterCollectorIntervals) -}}
{{- end -}}
{{- if lt (float64 $expireMs) (mulf $intervalMs 2.0) -}}
{{- fail (printf "job.expireAfterMs: %d ms is shorter than two collector intervals (collector.intervalSeconds %v): one late sweep would resolve every open candidate and the next would open it again; raise it or leave it null (derived from the interval)" (int64 $expireMs) .Values.collector.intervalSeconds) -}}
{{- end -}}
{{- int64 $expireMs -}}
{{- end -}}

{{- define "txnwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "txnwatch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The driver creates executor pods: a SparkApplication, or a driver Deployment with a k8s:// master. */}}
{{- define "txnwatch.launchesExecutors" -}}
{{- if and .Values.job.enabled (or (eq .Values.job.mode "sparkApplication") (hasPrefix "k8s://" .Values.job.deployment.master)) -}}
true
{{- end -}}
{{- end -}}

{{- define "txnwatch.checkpointClaim" -}}
{{- $pvc := .Values.job.checkpoint.persistentVolumeClaim -}}
{{- if $pvc.create -}}
{{- default (printf "%s-checkpoints" (include "txnwatch.fullname" .)) $pvc.claimName -}}
{{- else -}}
{{- $pvc.claimName -}}
{{- end -}}
{{- end -}}

{{/* Where Spark keeps the job's offsets and state; fails the render unless exactly one place is given. */}}
{{- define "txnwatch.checkpointLocation" -}}
{{- $ck := .Values.job.checkpoint -}}
{{- $claim := include "txnwatch.checkpointClaim" . -}}
{{- if and $ck.uri $claim -}}
{{- fail "job.checkpoint: set either uri or persistentVolumeClaim (claimName, or create: true), not both" -}}
{{- else if $ck.uri -}}
{{- $ck.uri -}}
{{- else if $claim -}}
{{- $ck.mountPath -}}
{{- else -}}
{{- fail "job.checkpoint: the streaming job needs durable checkpoint storage: set job.checkpoint.uri (e.g. s3a://bucket/txnwatch/checkpoints) or job.checkpoint.persistentVolumeClaim.claimName (or .create: true)" -}}
{{- end -}}
{{- end -}}

{{- define "txnwatch.bootstrapServers" -}}
{{- required "kafka.bootstrapServers is required: the Kafka cluster's bootstrap servers, host:port[,host:port...]" .Values.kafka.bootstrapServers -}}
{{- end -}}

{{- define "txnwatch.commandConfigPath" -}}
{{- if .Values.kafka.clientProperties.secretName -}}
{{- printf "/etc/txnwatch/kafka/%s" .Values.kafka.clientProperties.key -}}
{{- end -}}
{{- end -}}

{{/* TXNWATCH_* settings both apps read (common/settings.py), as a name → value map. */}}
{{- define "txnwatch.commonEnv" -}}
HOME: /tmp
TXNWATCH_CLUSTER: {{ .Values.cluster | quote }}
TXNWATCH_KAFKA__BOOTSTRAP_SERVERS: {{ include "txnwatch.bootstrapServers" . | quote }}
TXNWATCH_TOPICS__PREFIX: {{ .Values.topicPrefix | quote }}
TXNWATCH_LOG_LEVEL: {{ .Values.logLevel | quote }}
TXNWATCH_OUTPUT: json
{{- end -}}

{{/* The streaming job's settings (TXNWATCH_STREAM__*), as a name → value map. */}}
{{- define "txnwatch.streamEnv" -}}
{{ include "txnwatch.commonEnv" . }}
TXNWATCH_STREAM__CHECKPOINT_LOCATION: {{ include "txnwatch.checkpointLocation" . | quote }}
TXNWATCH_STREAM__STATE_BUCKETS: {{ int64 .Values.job.stateBuckets | quote }}
TXNWATCH_STREAM__TRIGGER: {{ .Values.job.trigger | quote }}
TXNWATCH_STREAM__STARTING_OFFSETS: {{ .Values.job.startingOffsets | quote }}
TXNWATCH_STREAM__COORDINATOR_SOURCE: {{ .Values.job.coordinatorSource | quote }}
{{- with .Values.job.maxOffsetsPerTrigger }}
TXNWATCH_STREAM__MAX_OFFSETS_PER_TRIGGER: {{ int64 . | quote }}
{{- end }}
{{- with .Values.job.coordinatorMaxOffsetsPerTrigger }}
TXNWATCH_STREAM__COORDINATOR_MAX_OFFSETS_PER_TRIGGER: {{ int64 . | quote }}
{{- end }}
TXNWATCH_STREAM__RESTART_QUERIES_EVERY_S: {{ .Values.job.restartQueriesEverySeconds | quote }}
TXNWATCH_STREAM__EXPIRE_AFTER_MS: {{ include "txnwatch.expireAfterMs" . | quote }}
TXNWATCH_STREAM__METRICS_HOST: "0.0.0.0"
{{- /* How malloc holds memory, from the process's start, for the driver's Python and a JVM spark-submit starts
before it (txnwatch sets the same for the JVM it starts itself): with glibc's defaults the memory it holds free
grows with uptime (docs/deploy.md, Memory). */}}
MALLOC_ARENA_MAX: "2"
MALLOC_MMAP_THRESHOLD_: "131072"
TXNWATCH_STREAM__METRICS_PORT: {{ int64 .Values.job.metricsPort | quote }}
{{- end -}}

{{/* `txnwatch stream` and its flags; Spark confs for the session go here (the session's builder sets them). */}}
{{- define "txnwatch.streamArgs" -}}
- stream
{{- with include "txnwatch.commandConfigPath" . }}
- --command-config
- {{ . }}
{{- end }}
- --conf
- {{ printf "spark.sql.shuffle.partitions=%d" (int64 .Values.job.shufflePartitions) | quote }}
{{- range $k, $v := .Values.job.sparkConf }}
- --conf
- {{ printf "%s=%s" $k (include "txnwatch.confValue" $v) | quote }}
{{- end }}
{{- range .Values.job.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* JVM options that fix a heap at its cap from the start (-Xms equal to the memory Spark turns into -Xmx, every
page touched at start): G1 otherwise resizes the committed heap, and the pod's memory with it (docs/deploy.md). */}}
{{- define "txnwatch.fixedHeap" -}}
-Xms{{ . }} -XX:+AlwaysPreTouch
{{- end }}

{{/* A Spark conf value as text: Helm reads every number as a float, so whole numbers are printed as integers
(1000000, not 1e+06). */}}
{{- define "txnwatch.confValue" -}}
{{- if and (eq (kindOf .) "float64") (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* A name → value map as a container's env list, followed by extra EnvVars. */}}
{{- define "txnwatch.envList" -}}
{{- range $k, $v := .env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "txnwatch.secretVolumes" -}}
{{- with .Values.kafka.clientProperties.secretName }}
- name: kafka-client-properties
  secret:
    secretName: {{ . }}
{{- end }}
{{- range $i, $m := .Values.kafka.secretMounts }}
- name: {{ printf "kafka-secret-%d" $i }}
  secret:
    secretName: {{ $m.secretName }}
{{- end }}
{{- end -}}

{{- define "txnwatch.secretVolumeMounts" -}}
{{- if .Values.kafka.clientProperties.secretName }}
- name: kafka-client-properties
  mountPath: /etc/txnwatch/kafka
  readOnly: true
{{- end }}
{{- range $i, $m := .Values.kafka.secretMounts }}
- name: {{ printf "kafka-secret-%d" $i }}
  mountPath: {{ $m.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "txnwatch.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- end -}}

{{/*
The probes of a container serving the metrics port, tied to progress (the same paths on the collector and the
streaming job's driver): startup and liveness ask /healthz (the process loop turns: 503 when it stalled, and the
kubelet restarts the container), readiness asks /readyz (a sweep published / a batch committed lately). Startup
holds liveness off while a slow start (Spark's JVM) is under way. Argument: the component's `probes` values.
*/}}
{{- define "txnwatch.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ int64 .periodSeconds }}
  timeoutSeconds: {{ int64 .timeoutSeconds }}
  failureThreshold: {{ int64 .startupFailureThreshold }}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ int64 .periodSeconds }}
  timeoutSeconds: {{ int64 .timeoutSeconds }}
  failureThreshold: {{ int64 .livenessFailureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: {{ int64 .periodSeconds }}
  timeoutSeconds: {{ int64 .timeoutSeconds }}
  failureThreshold: {{ int64 .readinessFailureThreshold }}
{{- end -}}

{{/* Is this CRD (group/version/Kind) served by the cluster, or named with `helm template --api-versions`? */}}
{{- define "txnwatch.hasCrd" -}}
{{- if .root.Capabilities.APIVersions.Has .crd }}true{{ end -}}
{{- end -}}
