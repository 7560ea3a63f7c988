{{/* Names and labels. */}}
{{- define "gristmill.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gristmill.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (list $ "api"). */}}
{{- define "gristmill.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gristmill.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gristmill.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image of a variant: include with (list $ "cpu"). */}}
{{- define "gristmill.image" -}}
{{- $ := index . 0 -}}
{{- $variant := index . 1 -}}
{{- $tag := default (printf "%s-%s" $.Chart.AppVersion $variant) $.Values.image.tag -}}
{{- if $.Values.image.tag -}}{{- $tag = printf "%s-%s" $.Values.image.tag $variant -}}{{- end -}}
{{- printf "%s:%s" $.Values.image.repository $tag -}}
{{- end -}}

{{/* The chart's own Secret (connection strings and passwords given in values). */}}
{{- define "gristmill.secretName" -}}
{{- printf "%s-connections" (include "gristmill.fullname" .) -}}
{{- end -}}

{{- define "gristmill.databaseSecret" -}}
{{- if .Values.cnpg.enabled -}}
{{- printf "%s-app" .Values.cnpg.cluster -}}
{{- else if .Values.postgres.existingSecret -}}
{{- .Values.postgres.existingSecret -}}
{{- else -}}
{{- include "gristmill.secretName" . -}}
{{- end -}}
{{- end -}}

{{- define "gristmill.databaseCASecret" -}}
{{- if .Values.postgres.caSecret -}}
{{- .Values.postgres.caSecret -}}
{{- else if .Values.cnpg.enabled -}}
{{- printf "%s-ca" .Values.cnpg.cluster -}}
{{- end -}}
{{- end -}}

{{- define "gristmill.kafkaPasswordSecret" -}}
{{- if .Values.kafka.sasl.existingSecret -}}
{{- .Values.kafka.sasl.existingSecret -}}
{{- else if and .Values.strimzi.enabled .Values.strimzi.user.create -}}
{{- .Values.strimzi.user.name -}}
{{- else -}}
{{- include "gristmill.secretName" . -}}
{{- end -}}
{{- end -}}

{{- define "gristmill.kafkaCASecret" -}}
{{- if .Values.kafka.tls.caSecret -}}
{{- .Values.kafka.tls.caSecret -}}
{{- else if .Values.strimzi.enabled -}}
{{- printf "%s-cluster-ca-cert" .Values.strimzi.cluster -}}
{{- end -}}
{{- end -}}

{{- define "gristmill.kafkaUsesSasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{- define "gristmill.kafkaUsesTls" -}}
{{- if or (eq .Values.kafka.securityProtocol "SSL") (eq .Values.kafka.securityProtocol "SASL_SSL") -}}true{{- end -}}
{{- end -}}

{{/* The environment every Gristmill process reads (gristmill/config.py). */}}
{{- define "gristmill.env" -}}
- name: KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "gristmill.databaseSecret" . }}
      key: {{ .Values.postgres.urlKey }}
{{- /* libpq reads these for every connection: TLS without touching the URL. */}}
{{- if and (hasPrefix "verify-" .Values.postgres.sslmode) (not (include "gristmill.databaseCASecret" .)) }}
{{- fail (printf "postgres.sslmode %s needs the server's CA: set postgres.caSecret (or enable cnpg); to opt out of TLS set postgres.sslmode disable" .Values.postgres.sslmode) }}
{{- end }}
- name: PGSSLMODE
  value: {{ .Values.postgres.sslmode | quote }}
{{- if include "gristmill.databaseCASecret" . }}
- name: PGSSLROOTCERT
  value: /etc/gristmill/postgres-ca/{{ .Values.postgres.caKey }}
{{- end }}
- name: GRISTMILL_TOPIC_PREFIX
  value: {{ .Values.topicPrefix | quote }}
- name: GRISTMILL_CONSUMER_GROUP
  value: {{ .Values.consumerGroup | quote }}
- name: GRISTMILL_TOPIC_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: GRISTMILL_TOPIC_REPLICATION
  value: {{ .Values.kafka.replication | quote }}
- name: GRISTMILL_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if include "gristmill.kafkaUsesSasl" . }}
- name: GRISTMILL_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: GRISTMILL_KAFKA_SASL_USERNAME
  value: {{ required "kafka.sasl.username is required with a SASL_* securityProtocol" .Values.kafka.sasl.username | quote }}
- name: GRISTMILL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "gristmill.kafkaPasswordSecret" . }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if and (include "gristmill.kafkaUsesTls" .) (include "gristmill.kafkaCASecret" .) }}
- name: GRISTMILL_KAFKA_SSL_CA_LOCATION
  value: /etc/gristmill/kafka-ca/{{ .Values.kafka.tls.caKey }}
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: GRISTMILL_KAFKA_SSL_CERTIFICATE_LOCATION
  value: /etc/gristmill/kafka-client/{{ .Values.kafka.tls.certKey }}
- name: GRISTMILL_KAFKA_SSL_KEY_LOCATION
  value: /etc/gristmill/kafka-client/{{ .Values.kafka.tls.keyKey }}
{{- end }}
{{- /* With GPU pods, every process (the migration that seeds the registry included)
knows the GPU's batch limit, unless settings name it. */}}
{{- if and .Values.gpu.enabled (not (hasKey .Values.settings "GRISTMILL_EMBED_MAX_BATCH")) }}
- name: GRISTMILL_EMBED_MAX_BATCH
  value: {{ .Values.gpu.embedMaxBatch | quote }}
{{- end }}
{{- range $name, $value := .Values.settings }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* The API's scratch space (bytes): every upload its processes may stage at once, at
its largest (values.yaml, api.uploads), plus 256 MiB for the rest. */}}
{{- define "gristmill.apiScratch" -}}
{{- $u := .Values.api.uploads -}}
{{- $perUpload := add (mul 2 (int64 $u.maxBytes)) (mul 100 (int64 $u.maxItems)) -}}
{{- add (mul (int64 .Values.api.processes) (int64 $u.maxConcurrent) $perUpload) 268435456 -}}
{{- end -}}

{{/* Certificate volumes and their mounts, and the writable scratch folders with /tmp
bounded: include with (list $ sizeLimit). */}}
{{- define "gristmill.volumes" -}}
{{- $ := index . 0 -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ index . 1 }}
- name: home
  emptyDir:
    sizeLimit: {{ $.Values.scratch.sizeLimit }}
{{- if include "gristmill.databaseCASecret" $ }}
- name: postgres-ca
  secret:
    secretName: {{ include "gristmill.databaseCASecret" $ }}
{{- end }}
{{- if and (include "gristmill.kafkaUsesTls" $) (include "gristmill.kafkaCASecret" $) }}
- name: kafka-ca
  secret:
    secretName: {{ include "gristmill.kafkaCASecret" $ }}
{{- end }}
{{- if $.Values.kafka.tls.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ $.Values.kafka.tls.clientSecret }}
{{- end }}
{{- end -}}

{{- define "gristmill.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/gristmill
{{- if include "gristmill.databaseCASecret" . }}
- name: postgres-ca
  mountPath: /etc/gristmill/postgres-ca
  readOnly: true
{{- end }}
{{- if and (include "gristmill.kafkaUsesTls" .) (include "gristmill.kafkaCASecret" .) }}
- name: kafka-ca
  mountPath: /etc/gristmill/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: kafka-client
  mountPath: /etc/gristmill/kafka-client
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every workload. */}}
{{- define "gristmill.podSpecCommon" -}}
serviceAccountName: {{ include "gristmill.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* KEDA's name for the SASL mechanism. */}}
{{- define "gristmill.kedaSasl" -}}
{{- $m := .Values.kafka.sasl.mechanism -}}
{{- if eq $m "PLAIN" -}}plaintext{{- else if eq $m "SCRAM-SHA-256" -}}scram_sha256{{- else if eq $m "SCRAM-SHA-512" -}}scram_sha512{{- else -}}{{- fail (printf "kafka.sasl.mechanism %s: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" $m) -}}{{- end -}}
{{- end -}}

{{- define "gristmill.kafkaNeedsAuth" -}}
{{- if or (include "gristmill.kafkaUsesSasl" .) (include "gristmill.kafkaUsesTls" .) -}}true{{- end -}}
{{- end -}}

{{/* Connection part of a KEDA Kafka trigger's metadata, and its authenticationRef. */}}
{{- define "gristmill.kedaKafkaAuth" -}}
{{- if include "gristmill.kafkaUsesSasl" . }}
sasl: {{ include "gristmill.kedaSasl" . }}
{{- end }}
{{- if include "gristmill.kafkaUsesTls" . }}
tls: enable
{{- end }}
{{- end -}}

{{/* KEDA triggers of one scheduler pool: include with (list $ keda-values models). */}}
{{- define "gristmill.kedaTriggers" -}}
{{- $ := index . 0 -}}
{{- $k := index . 1 -}}
{{- $model := index . 2 -}}
{{- range $lane := list "sync" "jobs" }}
- type: kafka
  name: {{ $lane }}-lag
  metadata:
    bootstrapServers: {{ $.Values.kafka.bootstrap | quote }}
    {{- if eq $lane "sync" }}
    # Every sync class's topic: the group's lag over all of them.
    consumerGroup: {{ $.Values.consumerGroup | quote }}
    lagThreshold: {{ $k.syncLagThreshold | quote }}
    {{- else }}
    consumerGroup: {{ printf "%s-jobs" $.Values.consumerGroup | quote }}
    topic: {{ printf "%s.requests.jobs" $.Values.topicPrefix | quote }}
    lagThreshold: {{ $k.jobsLagThreshold | quote }}
    {{- end }}
    activationLagThreshold: "0"
    offsetResetPolicy: earliest
    allowIdleConsumers: "false"
    {{- with include "gristmill.kedaKafkaAuth" $ | trim }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- if include "gristmill.kafkaNeedsAuth" $ }}
  authenticationRef:
    name: {{ include "gristmill.fullname" $ }}-kafka
  {{- end }}
{{- end }}
{{- if $.Values.prometheus.serverAddress }}
- type: prometheus
  name: oldest-message-age
  metadata:
    serverAddress: {{ $.Values.prometheus.serverAddress | quote }}
    # The oldest sync request still queued for this pool's model(s) (seconds).
    query: {{ printf "max(gristmill_oldest_message_age_seconds{class!=\"jobs\",model=~\"%s\"})" ($model | replace "," "|") | quote }}
    threshold: {{ $k.oldestAgeThresholdSeconds | quote }}
    activationThreshold: "0"
{{- end }}
{{- end -}}

{{/* Pod annotations: the configured ones, plus where Prometheus scrapes (list ctx port). */}}
{{- define "gristmill.podAnnotations" -}}
{{- $ := index . 0 -}}
{{- $port := index . 1 -}}
{{- $a := deepCopy (default (dict) $.Values.podAnnotations) -}}
{{- if $.Values.metrics.scrapeAnnotations -}}
{{- $_ := set $a "prometheus.io/scrape" "true" -}}
{{- $_ := set $a "prometheus.io/port" (toString $port) -}}
{{- $_ := set $a "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- with $a }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
