{{/* The image of both workloads. */}}
{{- define "kruise-rs.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Labels of one component (manager or daemon); also its selector. No helm.sh/chart or
app.kubernetes.io/managed-by labels: the default rendering is deploy/manifests/, which kubectl users
apply without Helm (helm install adds its managed-by label itself), and a selector cannot change. */}}
{{- define "kruise-rs.labels" -}}
app.kubernetes.io/name: kruise-rs
app.kubernetes.io/component: {{ . }}
{{- end }}
