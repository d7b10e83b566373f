{{/*
The RayCluster spec, shared by the RayCluster and the RayJob's rayClusterSpec.
Call with (dict "root" $ "role" "cluster"|"job").
*/}}
{{- define "mmpipe.rayClusterSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
rayVersion: {{ $v.head.rayVersion | quote }}
{{- if and (eq .role "cluster") $v.rayCluster.upgradeStrategy }}
upgradeStrategy:
  type: {{ $v.rayCluster.upgradeStrategy }}
{{- end }}
enableInTreeAutoscaling: {{ $v.head.enableInTreeAutoscaling }}
{{- with $v.head.autoscalerOptions }}
autoscalerOptions:
  {{- toYaml . | nindent 2 }}
{{- end }}
authOptions:
  mode: {{ $v.auth.mode }}
  {{- with $v.auth.secretName }}
  secretName: {{ . | quote }}
  {{- end }}
headGroupSpec:
  serviceType: {{ $v.head.serviceType }}
  {{- with $v.head.headService }}
  headService:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  rayStartParams:
    {{- include "mmpipe.rayStartParams" $v.head.rayStartParams | trim | nindent 4 }}
  template:
    {{- include "mmpipe.podTemplate" (dict "root" $root "group" $v.head "role" .role "component" "ray-head" "container" "ray-head" "serviceAccount" (include "mmpipe.headServiceAccountName" $root) "automountToken" true) | nindent 4 }}
workerGroupSpecs:
{{- $groups := dict -}}
{{- if not $v.worker.disabled }}
{{- $_ := set $groups $v.worker.groupName $v.worker }}
{{- end }}
{{- range $name, $group := $v.additionalWorkerGroups }}
{{- if not $group.disabled }}
{{- $_ := set $groups $name $group }}
{{- end }}
{{- end }}
{{- if not $groups }} []{{ end }}
{{- range $name, $group := $groups }}
  - groupName: {{ $name }}
    replicas: {{ $group.replicas }}
    minReplicas: {{ $group.minReplicas }}
    maxReplicas: {{ $group.maxReplicas }}
    {{- with $group.idleTimeoutSeconds }}
    idleTimeoutSeconds: {{ . }}
    {{- end }}
    {{- if $group.rayResources }}
    {{- if hasKey ($group.rayStartParams | default dict) "resources" }}
    {{- fail (printf "worker group %s: set rayResources or rayStartParams.resources, not both (KubeRay rejects both)" $name) }}
    {{- end }}
    resources:
      {{- range $k, $val := $group.rayResources }}
      {{ $k }}: {{ $val | toString | quote }}
      {{- end }}
    {{- end }}
    rayStartParams:
      {{- include "mmpipe.rayStartParams" $group.rayStartParams | trim | nindent 6 }}
    template:
      {{- include "mmpipe.podTemplate" (dict "root" $root "group" $group "role" $.role "component" (printf "ray-worker-%s" $name) "container" "ray-worker" "serviceAccount" (include "mmpipe.serviceAccountName" $root) "automountToken" $v.serviceAccount.automountWorkerToken) | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A Ray pod template. Call with (dict "root" $ "group" <values> "role" ... "component" ... "container" ...). */}}
{{- define "mmpipe.podTemplate" -}}
{{- $root := .root -}}
{{- $g := .group -}}
metadata:
  labels:
    {{- include "mmpipe.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    mmpipe.io/role: {{ .role }}
    {{- with $g.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $g.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with ($g.serviceAccountName | default .serviceAccount) }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- if not .automountToken }}
  automountServiceAccountToken: false
  {{- end }}
  {{- with $g.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $g.initContainers }}
  initContainers:
    {{- include "mmpipe.extraContainers" (dict "root" $root "containers" .) | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .container }}
      {{- include "mmpipe.image" (dict "root" $root "group" $g) | nindent 6 }}
      {{- with (include "mmpipe.env" (dict "root" $root "group" $g) | trim) }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with $g.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      ports:
        {{- if eq .container "ray-head" }}
        - {containerPort: 6379, name: gcs}
        - {containerPort: 8265, name: dashboard}
        - {containerPort: 10001, name: client}
        {{- end }}
        - {containerPort: 8080, name: metrics}
      resources:
        {{- toYaml $g.resources | nindent 8 }}
      {{- with (include "mmpipe.volumeMounts" (dict "root" $root "group" $g) | trim) }}
      volumeMounts:
        {{- . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "mmpipe.securityContext" (dict "root" $root "override" $g.securityContext) | nindent 8 }}
      {{- with $g.lifecycle }}
      lifecycle:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- with $g.sidecarContainers }}
    {{- include "mmpipe.extraContainers" (dict "root" $root "containers" .) | nindent 4 }}
    {{- end }}
  {{- with (include "mmpipe.volumes" (dict "root" $root "group" $g) | trim) }}
  volumes:
    {{- . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml (mergeOverwrite (deepCopy $root.Values.common.podSecurityContext) ($g.podSecurityContext | default dict)) | nindent 4 }}
  {{- with $g.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
