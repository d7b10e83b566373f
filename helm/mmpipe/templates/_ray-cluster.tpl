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
{{- /* the autoscaler (the head's image, KubeRay's container) gets the writable paths of a
read-only root filesystem too, from the head's scratch emptyDir */}}
{{- $opts := deepCopy . }}
{{- $_ := set $opts "volumeMounts" (concat (include "mmpipe.writableMounts" (dict "root" $root) | fromYamlArray) (.volumeMounts | default list)) }}
autoscalerOptions:
  {{- toYaml $opts | nindent 2 }}
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
    {{- if not $v.head.enableInTreeAutoscaling }}
    {{- /* with the autoscaler the field is its own (KubeRay made it optional for this,
    kuberay#1443): rendering it would make `helm upgrade` reset or conflict with the scaled
    count; the group starts at minReplicas */}}
    replicas: {{ $group.replicas }}
    {{- end }}
    minReplicas: {{ $group.minReplicas }}
    maxReplicas: {{ $group.maxReplicas }}
    {{- with $group.idleTimeoutSeconds }}
    idleTimeoutSeconds: {{ . }}
    {{- end }}
    {{- $params := deepCopy ($group.rayStartParams | default dict) }}
    {{- $rayResources := deepCopy ($group.rayResources | default dict) }}
    {{- if $rayResources }}
    {{- /* KubeRay rejects rayStartParams num-cpus / num-gpus / memory next to `resources`
    (mmpipe.validate refuses a clash): they go into `resources` as CPU / GPU / memory, which
    KubeRay turns back into the same `ray start` options */}}
    {{- range $param, $key := dict "num-cpus" "CPU" "num-gpus" "GPU" "memory" "memory" }}
    {{- if and (hasKey $params $param) (ne (toString (index $params $param)) "") }}
    {{- $_ := set $rayResources $key (index $params $param) }}
    {{- $_ := unset $params $param }}
    {{- end }}
    {{- end }}
    resources:
      {{- range $k, $val := $rayResources }}
      {{ $k }}: {{ $val | toString | quote }}
      {{- end }}
    {{- end }}
    rayStartParams:
      {{- include "mmpipe.rayStartParams" $params | trim | nindent 6 }}
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
    {{- with (include "mmpipe.logSidecar" $root | trim) }}
    {{- . | nindent 4 }}
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
  {{- with (include "mmpipe.affinity" (dict "root" $root "group" $g) | fromYaml) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
A group's affinity; a group that requests nvidia.com/gpu also gets the driver floor
(gpuDriver) as a required node affinity term, ANDed into each of its own required terms.
*/}}
{{- define "mmpipe.affinity" -}}
{{- $g := .group -}}
{{- $affinity := deepCopy ($g.affinity | default dict) -}}
{{- $drv := .root.Values.gpuDriver | default dict -}}
{{- $res := $g.resources | default dict -}}
{{- $gpu := gt (max (int (index ($res.limits | default dict) "nvidia.com/gpu" | default 0)) (int (index ($res.requests | default dict) "nvidia.com/gpu" | default 0))) 0 -}}
{{- if and $gpu $drv.nodeAffinity -}}
{{- $expr := dict "key" $drv.label "operator" "Gt" "values" (list (toString (sub (int $drv.minMajor) 1))) -}}
{{- $node := $affinity.nodeAffinity | default dict -}}
{{- $required := $node.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $terms := list -}}
{{- range ($required.nodeSelectorTerms | default (list dict)) -}}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" (append (.matchExpressions | default list) $expr)) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- with $affinity }}{{ toYaml . }}{{ end -}}
{{- end -}}
