{{/* Labels shared by every object. */}}
{{- define "nodekeeper.labels" -}}
app.kubernetes.io/part-of: nodekeeper
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "nodekeeper.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "nodekeeper.agentImage" -}}
{{ .Values.image.agentRepository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* "true" when the agent patches its own Node ([labels] mode = "direct"), else empty. */}}
{{- define "nodekeeper.agentPatchesNode" -}}
{{- $labels := (.Values.agent.config | default dict).labels | default dict -}}
{{- if eq ($labels.mode | default "report") "direct" -}}true{{- end -}}
{{- end -}}

{{- define "nodekeeper.serviceHost" -}}
nodekeeper-controller.{{ .Release.Namespace }}.svc
{{- end -}}

{{/*
TOML rendering. Helm's toToml writes every number as a float (4096 -> 4096.0), which CRI-O and
nodekeeper reject for integer keys, so the chart renders TOML itself: integral numbers as
integers, strings JSON-escaped (valid TOML basic strings), maps as tables, lists of maps as
arrays of tables, null values left out.
*/}}
{{- define "nodekeeper.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "nodekeeper.toml.value" -}}
{{- if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}{{ . }}
{{- else if kindIs "bool" . -}}{{ . }}
{{- else if kindIs "string" . -}}{{ toJson . }}
{{- else if kindIs "slice" . -}}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "nodekeeper.toml.value" $e }}{{ end }}]
{{- else if kindIs "map" . -}}{ {{- $first := true -}}{{ range $k, $v := . }}{{ if not (kindIs "invalid" $v) }}{{ if not $first }},{{ end }}{{ $first = false }} {{ include "nodekeeper.toml.key" $k }} = {{ include "nodekeeper.toml.value" $v }}{{ end }}{{ end }} }
{{- else -}}{{ fail (printf "nodekeeper: cannot render %v (%s) as TOML" . (kindOf .)) }}
{{- end -}}
{{- end -}}

{{- define "nodekeeper.toml.isTables" -}}
{{- if and (kindIs "slice" .) (gt (len .) 0) -}}
{{- $all := true -}}{{- range . -}}{{- if not (kindIs "map" .) -}}{{- $all = false -}}{{- end -}}{{- end -}}
{{- if $all -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* (dict "table" MAP "prefix" "a.b"): scalar keys first, then sub-tables, then arrays of tables. */}}
{{- define "nodekeeper.toml.table" -}}
{{- $prefix := .prefix -}}
{{- range $k, $v := .table -}}
{{- if not (or (kindIs "invalid" $v) (kindIs "map" $v) (include "nodekeeper.toml.isTables" $v)) }}
{{ include "nodekeeper.toml.key" $k }} = {{ include "nodekeeper.toml.value" $v }}
{{- end -}}
{{- end -}}
{{- range $k, $v := .table -}}
{{- $path := include "nodekeeper.toml.key" $k -}}
{{- if $prefix -}}{{- $path = printf "%s.%s" $prefix $path -}}{{- end -}}
{{- if kindIs "map" $v }}

[{{ $path }}]
{{- include "nodekeeper.toml.table" (dict "table" $v "prefix" $path) -}}
{{- else if include "nodekeeper.toml.isTables" $v -}}
{{- range $e := $v }}

[[{{ $path }}]]
{{- include "nodekeeper.toml.table" (dict "table" $e "prefix" $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The agent's config with the chart's defaults for [report]. */}}
{{- define "nodekeeper.agentConfig" -}}
{{- $cfg := deepCopy (.Values.agent.config | default dict) -}}
{{- $host := include "nodekeeper.serviceHost" . -}}
{{- $report := dict "url" (printf "https://%s:8443" $host) "ca_file" "/var/run/secrets/nodekeeper/ca.crt" "server_name" $host "token_file" "/var/run/secrets/nodekeeper/token" -}}
{{- $_ := set $cfg "report" (mergeOverwrite $report ($cfg.report | default dict)) -}}
{{- include "nodekeeper.toml.table" (dict "table" $cfg "prefix" "") | trim -}}
{{- end -}}

{{/* The controller's config with the chart's defaults for [controller]. */}}
{{- define "nodekeeper.controllerConfig" -}}
{{- $cfg := deepCopy (.Values.controller.config | default dict) -}}
{{- $ctl := dict "listen" "0.0.0.0:8443" "tls_cert_file" "/etc/nodekeeper/tls/tls.crt" "tls_key_file" "/etc/nodekeeper/tls/tls.key" "service_account" (printf "system:serviceaccount:%s:nodekeeper-agent" .Release.Namespace) "audience" "nodekeeper" "namespace" .Release.Namespace -}}
{{- $_ := set $cfg "controller" (mergeOverwrite $ctl ($cfg.controller | default dict)) -}}
{{- include "nodekeeper.toml.table" (dict "table" $cfg "prefix" "") | trim -}}
{{- end -}}
