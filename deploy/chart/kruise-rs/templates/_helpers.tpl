{{/* The image of both workloads. */}}
{{- define "kruise-rs.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels of one component (manager or daemon); also its selector. No Helm labels, so the
default rendering equals deploy/manifests/ exactly. */}}
{{- define "kruise-rs.labels" -}}
app.kubernetes.io/name: kruise-rs
app.kubernetes.io/component: {{ . }}
{{- end }}
