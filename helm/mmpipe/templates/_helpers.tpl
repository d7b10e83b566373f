{{/* Names and labels, as in KubeRay's ray-cluster chart. */}}
{{- define "mmpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "mmpipe.fullname" -}}
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

{{- define "mmpipe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select this release's pods (the dashboard Service uses them). */}}
{{- define "mmpipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mmpipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mmpipe.labels" -}}
{{ include "mmpipe.selectorLabels" . }}
helm.sh/chart: {{ include "mmpipe.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The workers' service account: serviceAccount.name, <fullname>-worker when created, or
none (the namespace default). */}}
{{- define "mmpipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-worker" (include "mmpipe.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The head's service account (the autoscaler's Role is bound to it): serviceAccount.headName,
<fullname>-head when created, or none (then KubeRay creates one named after the cluster). */}}
{{- define "mmpipe.headServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-head" (include "mmpipe.fullname" .)) .Values.serviceAccount.headName -}}
{{- else -}}
{{- .Values.serviceAccount.headName -}}
{{- end -}}
{{- end -}}

{{/* The RayJob's name: at most 47 characters (KubeRay's limit; it derives longer names). */}}
{{- define "mmpipe.rayJobName" -}}
{{- printf "%s-job" (include "mmpipe.fullname" . | trunc 43 | trimSuffix "-") -}}
{{- end -}}

{{/* One shell word: left as is when it holds only safe characters, else single-quoted. */}}
{{- define "mmpipe.shellQuote" -}}
{{- $s := toString . -}}
{{- if regexMatch "^[A-Za-z0-9_./=:,@%+-]+$" $s -}}
{{- $s -}}
{{- else -}}
{{- printf "'%s'" (replace "'" "'\\''" $s) -}}
{{- end -}}
{{- end -}}

{{- define "mmpipe.jobSpecConfigMap" -}}
{{- default (printf "%s-jobspec" (include "mmpipe.fullname" .)) .Values.jobSpec.existingConfigMap -}}
{{- end -}}

{{- define "mmpipe.hasJobSpec" -}}
{{- if or .Values.jobSpec.existingConfigMap .Values.jobSpec.spec -}}true{{- end -}}
{{- end -}}

{{/* The group's image: its image values merged over the top-level image. */}}
{{- define "mmpipe.image" -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (.group.image | default dict) -}}
image: {{ printf "%s:%s" $image.repository (toString $image.tag) | quote }}
imagePullPolicy: {{ $image.pullPolicy | default "IfNotPresent" }}
{{- end -}}

{{/*
Environment of every Ray container: common.containerEnv, object storage settings and
credentials (a Secret, or nothing when the service account carries an IAM role), then the
group's own containerEnv.
*/}}
{{- define "mmpipe.env" -}}
{{- $v := .root.Values -}}
{{- with $v.common.containerEnv }}
{{ toYaml . }}
{{- end }}
{{- if include "mmpipe.hasJobSpec" .root }}
- name: MMPIPE_JOB_SPEC
  value: {{ printf "%s/job.yaml" $v.jobSpec.mountPath | quote }}
{{- end }}
{{- with $v.s3.region }}
- name: AWS_REGION
  value: {{ . | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ . | quote }}
{{- end }}
{{- with $v.s3.endpointUrl }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $v.s3.credentialsSecret }}
{{- if .name }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ .name | quote }}, key: {{ .accessKeyIdKey | quote }}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ .name | quote }}, key: {{ .secretAccessKeyKey | quote }}}
{{- if .sessionTokenKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .name | quote }}, key: {{ .sessionTokenKey | quote }}}
{{- end }}
{{- end }}
{{- end }}
- name: TMPDIR
  value: /scratch
- name: HF_HOME
  value: /scratch/huggingface
- name: TORCH_HOME
  value: /scratch/torch
{{- with .group.containerEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "mmpipe.volumeMounts" -}}
- name: ray-logs
  mountPath: /tmp/ray
- name: scratch
  mountPath: /scratch
{{- if include "mmpipe.hasJobSpec" .root }}
- name: jobspec
  mountPath: {{ .root.Values.jobSpec.mountPath }}
  readOnly: true
{{- end }}
{{- with .group.volumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* ray-logs at /tmp/ray: KubeRay's own name for it, so that the autoscaler sidecar it adds
to the head mounts the same volume (it shares Ray's session logs). */}}
{{- define "mmpipe.volumes" -}}
- name: ray-logs
  emptyDir: {sizeLimit: {{ .group.storage.rayTmp | quote }}}
- name: scratch
  emptyDir: {sizeLimit: {{ .group.storage.scratch | quote }}}
{{- if include "mmpipe.hasJobSpec" .root }}
- name: jobspec
  configMap:
    name: {{ include "mmpipe.jobSpecConfigMap" .root }}
{{- end }}
{{- with .group.volumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* rayStartParams: every value a string, as the CRD requires. */}}
{{- define "mmpipe.rayStartParams" -}}
{{- if . }}
{{- range $key, $val := . }}
{{ $key }}: {{ $val | toString | quote }}
{{- end }}
{{- else -}}
{}
{{- end }}
{{- end -}}

{{/* A container securityContext: common.securityContext with `.override` merged over it. */}}
{{- define "mmpipe.securityContext" -}}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.common.securityContext) (.override | default dict)) -}}
{{- end -}}

{{/* Containers (init or sidecar) with the common securityContext merged under their own. */}}
{{- define "mmpipe.extraContainers" -}}
{{- $root := .root -}}
{{- range .containers }}
{{- $c := deepCopy . }}
{{- $_ := set $c "securityContext" (mergeOverwrite (deepCopy $root.Values.common.securityContext) (.securityContext | default dict)) }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end -}}
