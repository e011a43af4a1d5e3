{{/* Names and labels. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "sluice.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "sluice.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The gateway's pods (not the bundled Redis's). */}}
{{- define "sluice.gatewaySelector" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Whether sluice serves routes (a proxy listener), and the Envoy rate limit service. */}}
{{- define "sluice.servesRoutes" -}}
{{- if .Values.config.routes }}true{{ end }}
{{- end }}

{{/* The Secret holding the Redis password, if any. */}}
{{- define "sluice.redisSecret" -}}
{{- if .Values.redis.password.existingSecret }}{{ .Values.redis.password.existingSecret }}
{{- else if .Values.redis.password.value }}{{ include "sluice.fullname" . }}-redis-password
{{- end }}
{{- end }}

{{- define "sluice.redisSecretKey" -}}
{{- if .Values.redis.password.existingSecret }}{{ .Values.redis.password.existingSecretKey }}{{ else }}password{{ end }}
{{- end }}

{{/* sluice's redis: section, from .Values.redis (and the bundled Redis). */}}
{{- define "sluice.redisSection" -}}
{{- $r := dict "mode" .Values.redis.mode "timeout_ms" (int .Values.redis.timeoutMs) "key_prefix" .Values.redis.keyPrefix -}}
{{- if eq .Values.redis.mode "standalone" -}}
{{- $url := .Values.redis.url -}}
{{- if and (not $url) .Values.bundledRedis.enabled -}}
{{- $url = printf "redis://%s-redis:6379/0" (include "sluice.fullname" .) -}}
{{- end -}}
{{- if not $url -}}
{{- fail "redis.url is required (or bundledRedis.enabled for trying it out): every replica must share one Redis" -}}
{{- end -}}
{{- $_ := set $r "url" $url -}}
{{- else if eq .Values.redis.mode "cluster" -}}
{{- if not .Values.redis.nodes }}{{ fail "redis.nodes is required in cluster mode" }}{{ end -}}
{{- $_ := set $r "nodes" .Values.redis.nodes -}}
{{- else if eq .Values.redis.mode "sentinel" -}}
{{- if not (and .Values.redis.sentinels .Values.redis.masterName) }}{{ fail "redis.sentinels and redis.masterName are required in sentinel mode" }}{{ end -}}
{{- $_ := set $r "sentinels" .Values.redis.sentinels -}}
{{- $_ := set $r "master_name" .Values.redis.masterName -}}
{{- else -}}
{{- fail (printf "redis.mode %q: use standalone, cluster or sentinel" .Values.redis.mode) -}}
{{- end -}}
{{- if .Values.redis.username }}{{ $_ := set $r "username" .Values.redis.username }}{{ end -}}
{{- if include "sluice.redisSecret" . -}}
{{- $_ := set $r "password" (dict "file" (printf "/etc/sluice-secrets/%s" (include "sluice.redisSecretKey" .))) -}}
{{- end -}}
{{- toYaml $r }}
{{- end }}

{{/*
The whole configuration file: .Values.config with what the chart owns set over it (listeners
on the container's ports, redis, rls, the shutdown timings, watch: true).
*/}}
{{- define "sluice.config" -}}
{{- $c := deepCopy .Values.config -}}
{{- $server := default (dict) (get $c "server") -}}
{{- $_ := set $server "grace_period_seconds" (int .Values.shutdown.gracePeriodSeconds) -}}
{{- $_ := set $server "graceful_shutdown_timeout_seconds" (int .Values.shutdown.shutdownTimeoutSeconds) -}}
{{- $_ := set $c "server" $server -}}
{{- if include "sluice.servesRoutes" . -}}
{{- $_ := set $c "listen" (list (printf "0.0.0.0:%d" (int .Values.ports.proxy))) -}}
{{- end -}}
{{- $admin := default (dict) (get $c "admin") -}}
{{- $_ := set $admin "listen" (printf "0.0.0.0:%d" (int .Values.ports.admin)) -}}
{{- $_ := set $c "admin" $admin -}}
{{- $_ := set $c "redis" (include "sluice.redisSection" . | fromYaml) -}}
{{- if .Values.rls.enabled -}}
{{- $_ := set $c "rls" (dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.rls)) "config_dir" "/etc/sluice-rls" "algorithm" .Values.rls.algorithm) -}}
{{- end -}}
{{- $_ := set $c "watch" true -}}
{{- toYaml $c }}
{{- end }}

{{/*
What a reload cannot change (docs/operations.md): a change rolls the pods. The rest of the
configuration is followed in place by watch: true.
*/}}
{{- define "sluice.restartOnly" -}}
{{- toYaml (dict "ports" .Values.ports "redis" (include "sluice.redisSection" .) "shutdown" .Values.shutdown "rls" .Values.rls.enabled "routes" (include "sluice.servesRoutes" .)) }}
{{- end }}
