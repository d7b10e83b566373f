{{/* Observability: the log-shipping sidecar of every Ray pod (logShipping). */}}

{{- define "mmpipe.logShippingConfigMap" -}}
{{- printf "%s-log-shipping" (include "mmpipe.fullname" . | trunc 50 | trimSuffix "-") -}}
{{- end -}}

{{/* logShipping.sidecar as a container list item: ray-logs mounted read-only at /tmp/ray
(Ray's session and its logs), the chart's config files at configMountPath, the common
securityContext merged under its own. Empty when no sidecar is set. */}}
{{- define "mmpipe.logSidecar" -}}
{{- $ls := .Values.logShipping -}}
{{- if and $ls.config (not $ls.sidecar) }}
{{- fail "logShipping.config is set but logShipping.sidecar is empty: the config files are mounted in the sidecar only" }}
{{- end }}
{{- with $ls.sidecar }}
{{- if not .name }}
{{- fail "logShipping.sidecar.name is required (a container name, e.g. fluent-bit)" }}
{{- end }}
{{- if has .name (list "ray-head" "ray-worker" "autoscaler") }}
{{- fail (printf "logShipping.sidecar.name %q is the name of a container the chart or KubeRay adds: choose another" .name) }}
{{- end }}
{{- if not .image }}
{{- fail (printf "logShipping.sidecar.image is required (the image of the log sidecar %s)" .name) }}
{{- end }}
{{- $c := deepCopy . }}
{{- $mounts := list (dict "name" "ray-logs" "mountPath" "/tmp/ray" "readOnly" true) }}
{{- if $ls.config }}
{{- $mounts = append $mounts (dict "name" "log-shipping-config" "mountPath" $ls.configMountPath "readOnly" true) }}
{{- end }}
{{- $_ := set $c "volumeMounts" (concat $mounts (.volumeMounts | default list)) }}
{{- $_ := set $c "securityContext" (mergeOverwrite (deepCopy $.Values.common.securityContext) (.securityContext | default dict)) }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end -}}
