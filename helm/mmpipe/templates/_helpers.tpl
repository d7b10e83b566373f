{{/* Names and labels, as in KubeRay's ray-cluster chart. */}}
{{- define "mmpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The RayCluster's name, and the stem of every other name: at most 53 characters, KubeRay's
limit for a RayCluster (MaxRayClusterNameLength; "<fullname>-dashboard" stays within a
Service's 63). */}}
{{- define "mmpipe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 53 | trimSuffix "-" -}}
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

{{/* The group's image: its image values merged over the top-level image, as
repository:tag@digest (repository@digest with no tag, repository:tag with no digest). A group
that overrides repository or tag takes no digest but its own. */}}
{{- define "mmpipe.image" -}}
{{- $group := .group.image | default dict -}}
{{- $image := mergeOverwrite (deepCopy .root.Values.image) (deepCopy $group) -}}
{{- if and (or (hasKey $group "repository") (hasKey $group "tag")) (not (hasKey $group "digest")) -}}
{{- $_ := set $image "digest" "" -}}
{{- end -}}
{{- $tag := toString ($image.tag | default "") -}}
{{- $digest := $image.digest | default "" -}}
{{- if and $digest (not (regexMatch "^sha256:[a-f0-9]{64}$" $digest)) -}}
{{- fail (printf "image digest %q is not sha256:<64 lowercase hex> (the image's manifest digest)" $digest) -}}
{{- end -}}
{{- if and $digest (contains "@" $tag) -}}
{{- fail (printf "image tag %q already holds a digest and digest %q is set too: keep one" $tag $digest) -}}
{{- end -}}
{{- if and (not $tag) (not $digest) -}}
{{- fail (printf "image %s has neither a tag nor a digest" $image.repository) -}}
{{- end -}}
{{- $ref := $image.repository -}}
{{- if $tag }}{{ $ref = printf "%s:%s" $ref $tag }}{{ end -}}
{{- if $digest }}{{ $ref = printf "%s@%s" $ref $digest }}{{ end -}}
image: {{ $ref | quote }}
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
{{- if and .name (eq (.mode | default "file") "file") }}
- name: AWS_SHARED_CREDENTIALS_FILE
  value: {{ include "mmpipe.awsCredentialsFile" $.root | quote }}
{{- else if .name }}
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
- name: RAY_TMPDIR
  value: /tmp
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
{{ include "mmpipe.writableMounts" . }}
{{- if include "mmpipe.awsCredentialsMounted" .root }}
- name: aws-credentials
  mountPath: {{ include "mmpipe.awsCredentialsFile" .root | dir }}
  readOnly: true
{{- end }}
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
{{- if include "mmpipe.awsCredentialsMounted" .root }}
- name: aws-credentials
  secret:
    secretName: {{ .root.Values.s3.credentialsSecret.name | quote }}
    items:
      - {key: {{ .root.Values.s3.credentialsSecret.credentialsFileKey | quote }}, path: credentials}
{{- end }}
{{- if include "mmpipe.hasJobSpec" .root }}
- name: jobspec
  configMap:
    name: {{ include "mmpipe.jobSpecConfigMap" .root }}
{{- end }}
{{- if and .root.Values.logShipping.sidecar .root.Values.logShipping.config }}
- name: log-shipping-config
  configMap:
    name: {{ include "mmpipe.logShippingConfigMap" .root }}
{{- end }}
{{- with .group.volumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Where a read-only root filesystem leaves Ray and mmpipe room to write (besides /tmp/ray
and /scratch): /tmp (sockets and files of tools that ignore TMPDIR), ~/.ray (Ray's CLI
state, auth_token), ~/.cache (model caches, pip/uv of a runtime_env), ~/.config; each a
sub-directory of the scratch emptyDir (its sizeLimit covers them). */}}
{{- define "mmpipe.writableMounts" -}}
- {name: scratch, mountPath: /tmp, subPath: tmp}
- {name: scratch, mountPath: /home/ray/.ray, subPath: home/.ray}
- {name: scratch, mountPath: /home/ray/.cache, subPath: home/.cache}
- {name: scratch, mountPath: /home/ray/.config, subPath: home/.config}
{{- end -}}

{{/* s3.credentialsSecret in mode file: the shared credentials file's path, and whether
it is mounted. */}}
{{- define "mmpipe.awsCredentialsFile" -}}
/var/run/secrets/mmpipe/aws/credentials
{{- end -}}

{{- define "mmpipe.awsCredentialsMounted" -}}
{{- with .Values.s3.credentialsSecret }}{{ if and .name (eq (.mode | default "file") "file") }}true{{ end }}{{ end -}}
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
