{{/* Names, labels and the rendered gatewayscope.toml. */}}

{{- define "gatewayscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: RELEASE-gatewayscope, or RELEASE alone when it already holds the chart's name. */}}
{{- define "gatewayscope.fullname" -}}
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

{{- define "gatewayscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gatewayscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gatewayscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gatewayscope.labels" -}}
helm.sh/chart: {{ include "gatewayscope.chart" . }}
{{ include "gatewayscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gatewayscope
{{- end }}

{{- define "gatewayscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gatewayscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gatewayscope.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "gatewayscope.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* What every ServiceMonitor endpoint and spec share. */}}
{{- define "gatewayscope.endpointCommon" -}}
{{- $sm := .Values.serviceMonitor -}}
port: http
scheme: {{ include "gatewayscope.scheme" . }}
{{- if .Values.basicAuth.enabled }}
basicAuth:
  username:
    name: {{ .Values.basicAuth.existingSecret }}
    key: {{ .Values.basicAuth.usernameKey }}
  password:
    name: {{ .Values.basicAuth.existingSecret }}
    key: {{ .Values.basicAuth.passwordKey }}
{{- end }}
{{- if and .Values.tls.enabled $sm.tlsConfig }}
tlsConfig:
  {{- toYaml $sm.tlsConfig | nindent 2 }}
{{- end }}
{{- with $sm.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- define "gatewayscope.serviceMonitorSpec" -}}
namespaceSelector:
  matchNames:
    - {{ .Release.Namespace }}
selector:
  matchLabels:
    {{- include "gatewayscope.selectorLabels" . | nindent 4 }}
{{- end }}

{{/* Where the pod mounts what the config names. */}}
{{- define "gatewayscope.configDir" -}}/etc/gatewayscope{{- end }}
{{- define "gatewayscope.secretsDir" -}}/etc/gatewayscope/secrets{{- end }}

{{/* A target's name as a DNS label: lowercase, runs of anything but [a-z0-9-] turned into one "-". */}}
{{- define "gatewayscope.dnsName" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower .) "-" | trimAll "-" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
gatewayscope.toml. Strings go through toJson (a JSON string is a TOML basic string); whole numbers through
int64, since Helm reads every YAML number as a float and 536870912 would print as 5.36870912e+08.
*/}}
{{- define "gatewayscope.toml" -}}
{{- $secrets := include "gatewayscope.secretsDir" . -}}
# gatewayscope.toml, rendered by the gatewayscope Helm chart from its values (docs/configuration.md).
{{- range $index, $target := .Values.config.targets }}

[[targets]]
name = {{ $target.name | toJson }}
kind = {{ $target.kind | toJson }}
{{- range $key := list "url" "path" }}
{{- if hasKey $target $key }}
{{ $key }} = {{ index $target $key | toJson }}
{{- end }}
{{- end }}
{{- if hasKey $target "timeout_seconds" }}
timeout_seconds = {{ $target.timeout_seconds | float64 }}
{{- end }}
{{- range $key := list "max_body_bytes" "concurrency" "memory_limit_bytes" }}
{{- if hasKey $target $key }}
{{ $key }} = {{ index $target $key | int64 }}
{{- end }}
{{- end }}
{{- with $target.auth }}
[targets.auth]
{{- if .username }}
username = {{ .username | toJson }}
{{- else }}
username_file = {{ printf "%s/targets/%d/username" $secrets $index | toJson }}
{{- end }}
password_file = {{ printf "%s/targets/%d/password" $secrets $index | toJson }}
{{- end }}
{{- end }}
{{- with .Values.config.policy }}

[policy]
{{- if hasKey . "orphan_idle_seconds" }}
orphan_idle_seconds = {{ .orphan_idle_seconds | float64 }}
{{- end }}
{{- range $key := list "max_weight_lag" "standard_pool" "custom_pool" "queue_per_worker" }}
{{- if hasKey $.Values.config.policy $key }}
{{ $key }} = {{ index $.Values.config.policy $key | int64 }}
{{- end }}
{{- end }}
{{- end }}

[exporter]
{{- range $key := list "min_interval_seconds" "default_scrape_timeout_seconds" "scrape_timeout_margin_seconds" "full_read_interval_seconds" }}
{{- if hasKey $.Values.config.exporter $key }}
{{ $key }} = {{ index $.Values.config.exporter $key | float64 }}
{{- end }}
{{- end }}
{{- if hasKey .Values.config.exporter "max_record_series" }}
max_record_series = {{ .Values.config.exporter.max_record_series | int64 }}
{{- end }}
{{- if .Values.tls.enabled }}
tls_cert_file = {{ printf "%s/tls/tls.crt" $secrets | toJson }}
tls_key_file = {{ printf "%s/tls/tls.key" $secrets | toJson }}
{{- end }}
{{- if .Values.basicAuth.enabled }}
basic_auth_username_file = {{ printf "%s/basic-auth/username" $secrets | toJson }}
basic_auth_password_file = {{ printf "%s/basic-auth/password" $secrets | toJson }}
{{- end }}
{{- if .Values.heal.enabled }}

[heal]
state_dir = {{ .Values.heal.mountPath | toJson }}
{{- with .Values.heal.toml }}
{{ . }}
{{- end }}
{{- end }}
{{- end }}
