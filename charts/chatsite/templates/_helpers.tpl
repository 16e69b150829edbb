{{- define "chatsite.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "chatsite.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "chatsite.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "chatsite.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "chatsite.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "chatsite.fullname" .)) -}}
{{- end -}}

{{/* The settings and credentials every chatsite container reads. */}}
{{- define "chatsite.env" -}}
envFrom:
  - configMapRef:
      name: {{ include "chatsite.fullname" . }}-config
env:
  {{- range $key := list "DJANGO_SECRET_KEY" "METRICS_TOKEN" "DATABASE_URL" "REDIS_URL" }}
  - name: {{ $key }}
    valueFrom:
      secretKeyRef:
        name: {{ include "chatsite.secretName" $ }}
        key: {{ $key }}
  {{- end }}
  # Optional: the guard model's key (MODERATION_GUARD_URL), where one is used.
  - name: MODERATION_GUARD_API_KEY
    valueFrom:
      secretKeyRef:
        name: {{ include "chatsite.secretName" . }}
        key: MODERATION_GUARD_API_KEY
        optional: true
  {{- range $key := concat (keys .Values.secrets.extra | sortAlpha) .Values.secrets.extraKeys | uniq }}
  - name: {{ $key }}
    valueFrom:
      secretKeyRef:
        name: {{ include "chatsite.secretName" $ }}
        key: {{ $key }}
  {{- end }}
{{- end -}}

{{/* Waits until every migration is applied: the migration Job runs after install and before upgrades. */}}
{{- define "chatsite.waitForMigrations" -}}
- name: wait-for-migrations
  image: {{ include "chatsite.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["wait-for-migrations"]
  {{- include "chatsite.env" . | nindent 2 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 100m, memory: 256Mi}
{{- end -}}

{{/* A value kept from the live Secret across upgrades, else the given one, else a fresh random one. */}}
{{- define "chatsite.secretValue" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if .value -}}
{{- .value -}}
{{- else if and $existing (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 50 -}}
{{- end -}}
{{- end -}}
