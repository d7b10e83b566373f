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
{{- /* replicas is rendered (and used) only without the autoscaler */ -}}
{{- if and (not $v.head.enableInTreeAutoscaling) (or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas))) -}}
{{- fail (printf "worker group %s: replicas (%v) must be between minReplicas (%v) and maxReplicas (%v)" $gname $g.replicas $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if and $g.idleTimeoutSeconds (not $v2) -}}
{{- fail (printf "worker group %s: idleTimeoutSeconds needs autoscaler v2 (head.enableInTreeAutoscaling=true and head.autoscalerOptions.version=v2); KubeRay rejects it otherwise" $gname) -}}
{{- end -}}
{{- if hasKey ($g.rayStartParams | default dict) "labels" -}}
{{- fail (printf "worker group %s: rayStartParams.labels is not supported by KubeRay; use the group's labels" $gname) -}}
{{- end -}}
{{- end -}}
{{- /* the values path of each rendered group, for the messages */ -}}
{{- $paths := dict -}}
{{- if not $v.worker.disabled }}{{ $_ := set $paths $v.worker.groupName "worker" }}{{ end -}}
{{- range $gname, $g := $v.additionalWorkerGroups -}}
{{- if not $g.disabled -}}
{{- if hasKey $paths $gname -}}
{{- fail (printf "worker.groupName=%s is also the name of additionalWorkerGroups.%s, which is enabled: KubeRay needs unique group names (the chart would drop one group); rename worker.groupName or disable additionalWorkerGroups.%s" $gname $gname $gname) -}}
{{- end -}}
{{- $_ := set $paths $gname (printf "additionalWorkerGroups.%s" $gname) -}}
{{- end -}}
{{- end -}}
{{- range $gname, $g := $groups -}}
{{- $path := index $paths $gname -}}
{{- $params := $g.rayStartParams | default dict -}}
{{- if $g.rayResources -}}
{{- if hasKey $params "resources" -}}
{{- fail (printf "%s: set rayResources or rayStartParams.resources, not both (KubeRay rejects both)" $path) -}}
{{- end -}}
{{- range $param, $match := dict "num-cpus" "^cpu$" "num-gpus" "gpu$" "memory" "^memory$" -}}
{{- if hasKey $params $param -}}
{{- range $k, $_ := $g.rayResources -}}
{{- if regexMatch $match (lower $k) -}}
{{- fail (printf "%s: rayStartParams.%s and rayResources.%s say the same thing twice; set one (the chart renders rayStartParams.%s as rayResources.%s)" $path $param $k $param (index (dict "num-cpus" "CPU" "num-gpus" "GPU" "memory" "memory") $param)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range ($v.head.autoscalerOptions.env | default list) -}}
{{- if eq (toString .name) "KUBERAY_GEN_AUTOSCALER_START_CMD" -}}
{{- fail "head.autoscalerOptions.env must not set KUBERAY_GEN_AUTOSCALER_START_CMD: KubeRay injects it into the autoscaler container and rejects a cluster that sets it" -}}
{{- end -}}
{{- end -}}
{{- /* an unauthenticated Ray job API (it runs any code it is sent) on an address outside the cluster */ -}}
{{- if eq $v.auth.mode "disabled" -}}
{{- if $v.ingress.enabled -}}
{{- fail "auth.mode=disabled with ingress.enabled=true: the Ingress would put an unauthenticated Ray job API on an external address; keep auth.mode=token (the default) or disable the Ingress" -}}
{{- end -}}
{{- if and $v.dashboardService.enabled (has $v.dashboardService.type (list "LoadBalancer" "NodePort")) -}}
{{- fail (printf "auth.mode=disabled with dashboardService.type=%s: the Service would put an unauthenticated Ray job API on an external address; keep auth.mode=token (the default) or use dashboardService.type=ClusterIP" $v.dashboardService.type) -}}
{{- end -}}
{{- $headType := toString (dig "spec" "type" "" ($v.head.headService | default dict)) -}}
{{- if has $headType (list "LoadBalancer" "NodePort") -}}
{{- fail (printf "auth.mode=disabled with head.headService.spec.type=%s: every head port, the job API included, would be unauthenticated on an external address; keep auth.mode=token" $headType) -}}
{{- end -}}
{{- end -}}
{{- with $v.networkPolicy -}}
{{- if .enabled -}}
{{- if and $v.ingress.enabled $v.dashboardService.enabled (not .ingressFrom) -}}
{{- fail "ingress.enabled=true with networkPolicy.enabled=true needs networkPolicy.ingressFrom: the NetworkPolicy admits the dashboard only from listed peers, so it would block your Ingress controller; set it, e.g. networkPolicy.ingressFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=ingress-nginx" -}}
{{- end -}}
{{- if and $v.dashboardService.enabled (has $v.dashboardService.type (list "LoadBalancer" "NodePort")) (not .dashboardFrom) -}}
{{- fail (printf "dashboardService.type=%s with networkPolicy.enabled=true needs networkPolicy.dashboardFrom (the addresses that may reach the job API, e.g. an ipBlock): the NetworkPolicy would block every client outside the cluster" $v.dashboardService.type) -}}
{{- end -}}
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
{{- /* Kueue's RayJob webhook (pkg/controller/jobs/rayjob/rayjob_webhook.go) refuses a queued
RayJob that autoscales, keeps its cluster, runs on an existing one, has more than 7 worker
groups or one named "head" */ -}}
{{- if and (or $j.queueName $j.suspend) $v.head.enableInTreeAutoscaling (not $j.clusterSelector) -}}
{{- $why := ternary (printf "rayJob.queueName=%s (Kueue)" $j.queueName) "rayJob.suspend=true (the Kueue path)" (not (empty $j.queueName)) -}}
{{- fail (printf "%s needs head.enableInTreeAutoscaling=false: Kueue refuses a RayJob whose cluster autoscales ('a kueue managed job should not use autoscaling'); without the autoscaler the job's cluster runs each worker group's replicas, which is what Kueue admits" $why) -}}
{{- end -}}
{{- if $j.queueName -}}
{{- if not $j.shutdownAfterJobFinishes -}}
{{- fail (printf "rayJob.queueName=%s (Kueue) needs rayJob.shutdownAfterJobFinishes=true: Kueue refuses a RayJob that keeps its cluster (it would hold the queue's quota)" $j.queueName) -}}
{{- end -}}
{{- if $j.clusterSelector -}}
{{- fail (printf "rayJob.queueName=%s (Kueue) cannot be combined with rayJob.clusterSelector: Kueue refuses a RayJob on an existing cluster" $j.queueName) -}}
{{- end -}}
{{- if gt (len $groups) 7 -}}
{{- fail (printf "rayJob.queueName=%s (Kueue): at most 7 worker groups (%d enabled)" $j.queueName (len $groups)) -}}
{{- end -}}
{{- if hasKey $groups "head" -}}
{{- fail (printf "rayJob.queueName=%s (Kueue): no worker group may be named \"head\" (Kueue reserves it for the head)" $j.queueName) -}}
{{- end -}}
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
{{- if eq $j.submissionMode "SidecarMode" -}}
{{- fail "rayJob.submissionMode=SidecarMode: KubeRay (1.6, 1.7) adds the submitter container to the head pod with no securityContext and no field to give it one, so Pod Security \"restricted\" refuses the head pod and the cluster never starts; use K8sJobMode (the default: a restricted submitter pod) or HTTPMode (the operator submits, no submitter)" -}}
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
{{- $selector := not (empty $j.clusterSelector) -}}
{{- $autoscaling := and (not $selector) $.Values.head.enableInTreeAutoscaling -}}
{{- $seen := dict -}}
{{- range $i, $rule := (.deletionRules | default list) -}}
{{- $c := $rule.condition | default dict -}}
{{- $policy := toString $rule.policy -}}
{{- if eq (hasKey $c "jobStatus") (hasKey $c "jobDeploymentStatus") -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d].condition needs exactly one of jobStatus and jobDeploymentStatus" $i) -}}
{{- end -}}
{{- if and $selector (has $policy (list "DeleteCluster" "DeleteWorkers")) -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d]: %s is not supported with rayJob.clusterSelector (the cluster is not the RayJob's)" $i $policy) -}}
{{- end -}}
{{- if and (eq $policy "DeleteWorkers") $autoscaling -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d]: DeleteWorkers is not supported with autoscaling (head.enableInTreeAutoscaling)" $i) -}}
{{- end -}}
{{- $status := ternary (printf "jobStatus %v" $c.jobStatus) (printf "jobDeploymentStatus %v" $c.jobDeploymentStatus) (hasKey $c "jobStatus") -}}
{{- $key := printf "%s/%s" $status $policy -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules[%d]: a second %s rule for %s (KubeRay rejects duplicates)" $i $policy $status) -}}
{{- end -}}
{{- $_ := set $seen $key (int ($c.ttlSeconds | default 0)) -}}
{{- end -}}
{{- /* TTLs must not decrease along DeleteWorkers -> DeleteCluster -> DeleteSelf, per condition */ -}}
{{- range $key, $ttl := $seen -}}
{{- $status := index (splitList "/" $key) 0 -}}
{{- $policy := index (splitList "/" $key) 1 -}}
{{- $earlier := dict "DeleteCluster" (list "DeleteWorkers") "DeleteSelf" (list "DeleteWorkers" "DeleteCluster") -}}
{{- range (index $earlier $policy | default list) -}}
{{- $other := printf "%s/%s" $status . -}}
{{- if and (hasKey $seen $other) (lt $ttl (index $seen $other)) -}}
{{- fail (printf "rayJob.deletionStrategy.deletionRules: for %s the %s ttlSeconds (%d) must be at least the %s one (%d)" $status $policy $ttl . (index $seen $other)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not .deletionRules) (not (and .onSuccess .onFailure)) -}}
{{- fail "rayJob.deletionStrategy needs either deletionRules or both onSuccess and onFailure" -}}
{{- end -}}
{{- if and .onSuccess .onFailure -}}
{{- range $when, $p := dict "onSuccess" (toString .onSuccess.policy) "onFailure" (toString .onFailure.policy) -}}
{{- if and $selector (has $p (list "DeleteCluster" "DeleteWorkers")) -}}
{{- fail (printf "rayJob.deletionStrategy.%s.policy=%s is not supported with rayJob.clusterSelector (the cluster is not the RayJob's)" $when $p) -}}
{{- end -}}
{{- if and (eq $p "DeleteWorkers") $autoscaling -}}
{{- fail (printf "rayJob.deletionStrategy.%s.policy=DeleteWorkers is not supported with autoscaling (head.enableInTreeAutoscaling)" $when) -}}
{{- end -}}
{{- if and (eq $p "DeleteNone") $j.shutdownAfterJobFinishes -}}
{{- fail (printf "rayJob.deletionStrategy.%s.policy=DeleteNone contradicts rayJob.shutdownAfterJobFinishes=true (KubeRay rejects it); set shutdownAfterJobFinishes=false" $when) -}}
{{- end -}}
{{- end -}}
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
