{{/*
What the KubeRay operator (v1.7: ray-operator/controllers/ray/utils/validation.go and the
RayCluster/RayJob webhooks) would reject after `helm install` succeeded - the RayCluster or
RayJob then sits there and no pod is ever created - fails here, at install, with a message.
tests/deploy/chart_check.py (operator_errors) checks the same rules on what is rendered.
*/}}
{{- define "mmpipe.validate" -}}
{{- $v := .Values -}}
{{- $name := include "mmpipe.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "the object name %q (release name, or fullnameOverride) must be a DNS-1035 label: lower case letters, digits and '-', starting with a letter; KubeRay rejects a RayCluster/RayJob named otherwise" $name) -}}
{{- end -}}
{{- $v2 := and $v.head.enableInTreeAutoscaling (eq (toString ($v.head.autoscalerOptions.version | default "")) "v2") -}}
{{- $groups := dict -}}
{{- if not $v.worker.disabled }}{{ $_ := set $groups $v.worker.groupName $v.worker }}{{ end -}}
{{- range $gname, $g := $v.additionalWorkerGroups }}{{ if not $g.disabled }}{{ $_ := set $groups $gname $g }}{{ end }}{{ end -}}
{{- range $gname, $g := $groups -}}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) -}}
{{- fail (printf "worker group %s: minReplicas (%v) is greater than maxReplicas (%v)" $gname $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "worker group %s: replicas (%v) must be between minReplicas (%v) and maxReplicas (%v)" $gname $g.replicas $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if and $g.idleTimeoutSeconds (not $v2) -}}
{{- fail (printf "worker group %s: idleTimeoutSeconds needs autoscaler v2 (head.enableInTreeAutoscaling=true and head.autoscalerOptions.version=v2); KubeRay rejects it otherwise" $gname) -}}
{{- end -}}
{{- if hasKey ($g.rayStartParams | default dict) "labels" -}}
{{- fail (printf "worker group %s: rayStartParams.labels is not supported by KubeRay; use the group's labels" $gname) -}}
{{- end -}}
{{- end -}}
{{- if hasKey ($v.head.rayStartParams | default dict) "labels" -}}
{{- fail "head: rayStartParams.labels is not supported by KubeRay; use head.labels" -}}
{{- end -}}
{{- if hasKey ($v.head.rayStartParams | default dict) "redis-username" -}}
{{- fail "head: rayStartParams.redis-username is rejected by KubeRay (GCS fault tolerance options are not exposed by this chart)" -}}
{{- end -}}
{{- $headEnv := concat ($v.common.containerEnv | default list) ($v.head.containerEnv | default list) -}}
{{- range $headEnv -}}
{{- if eq .name "RAY_enable_autoscaler_v2" -}}
{{- fail "RAY_enable_autoscaler_v2 in the head's env: KubeRay rejects it; set head.autoscalerOptions.version (v1 or v2) instead" -}}
{{- end -}}
{{- if has .name (list "RAY_REDIS_ADDRESS" "REDIS_PASSWORD" "REDIS_USERNAME") -}}
{{- fail (printf "%s in the head's env: KubeRay rejects it without gcsFaultToleranceOptions, which this chart does not render" .name) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $v.auth.mode "token") (semverCompare "<2.52.0-0" (toString $v.head.rayVersion)) -}}
{{- fail (printf "auth.mode=token needs Ray 2.52.0 or later (head.rayVersion is %s)" $v.head.rayVersion) -}}
{{- end -}}
{{- if $v.rayJob.enabled -}}
{{- $j := $v.rayJob -}}
{{- if and $j.suspend (not $j.shutdownAfterJobFinishes) -}}
{{- fail "rayJob.suspend=true needs rayJob.shutdownAfterJobFinishes=true (KubeRay does not suspend a RayJob that keeps its cluster)" -}}
{{- end -}}
{{- if $j.clusterSelector -}}
{{- if $j.suspend }}{{ fail "rayJob.clusterSelector (an existing cluster) cannot be combined with rayJob.suspend" }}{{ end -}}
{{- if eq $j.submissionMode "SidecarMode" }}{{ fail "rayJob.clusterSelector is not supported with submissionMode SidecarMode" }}{{ end -}}
{{- if not (index $j.clusterSelector "ray.io/cluster") }}{{ fail "rayJob.clusterSelector needs the key ray.io/cluster (the RayCluster's name)" }}{{ end -}}
{{- if gt (int $j.backoffLimit) 0 }}{{ fail "rayJob.clusterSelector (an existing cluster) needs rayJob.backoffLimit=0 (KubeRay retries only on a new cluster)" }}{{ end -}}
{{- end -}}
{{- if and (eq $j.submissionMode "InteractiveMode") (gt (int $j.backoffLimit) 0) -}}
{{- fail "rayJob.backoffLimit must be 0 with submissionMode InteractiveMode (KubeRay rejects retries there)" -}}
{{- end -}}
{{- if and (eq $j.submissionMode "SidecarMode") $j.submitter.podTemplate -}}
{{- fail "rayJob.submitter.podTemplate is not supported with submissionMode SidecarMode" -}}
{{- end -}}
{{- with $j.deletionStrategy -}}
{{- if and .deletionRules $j.shutdownAfterJobFinishes -}}
{{- fail "rayJob.deletionStrategy.deletionRules needs rayJob.shutdownAfterJobFinishes=false (KubeRay: mutually exclusive)" -}}
{{- end -}}
{{- if and .deletionRules (or .onSuccess .onFailure) -}}
{{- fail "rayJob.deletionStrategy: deletionRules and onSuccess/onFailure cannot be used together" -}}
{{- end -}}
{{- range $i, $rule := (.deletionRules | default list) -}}
{{- $c := $rule.condition | default dict -}}
{{- if eq (hasKey $c "jobStatus") (hasKey $c "jobDeploymentStatus") -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d].condition needs exactly one of jobStatus and jobDeploymentStatus" $i) -}}
{{- end -}}
{{- if and (eq (toString $rule.policy) "DeleteWorkers") $.Values.head.enableInTreeAutoscaling -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d]: DeleteWorkers is not supported with autoscaling (head.enableInTreeAutoscaling)" $i) -}}
{{- end -}}
{{- end -}}
{{- if and (not .deletionRules) (not (and .onSuccess .onFailure)) -}}
{{- fail "rayJob.deletionStrategy needs either deletionRules or both onSuccess and onFailure" -}}
{{- end -}}
{{- end -}}
{{- with $j.runtimeEnvYAML -}}
{{- $env := fromYaml . -}}
{{- if hasKey $env "Error" -}}
{{- fail (printf "rayJob.runtimeEnvYAML is not valid YAML: %s" (get $env "Error")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
