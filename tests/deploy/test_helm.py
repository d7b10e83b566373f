"""The Helm chart, checked with the real ``helm`` v4 binary and the KubeRay CRD schemas:
lint and render the default, GPU, RayJob and S3-secret values and a list of reasonable
overrides; validate every RayCluster and RayJob against the closed CRD schemas, the KubeRay
operator's own validation rules (ported) and Pod Security Standards "restricted"; and make
sure deliberately broken values, and overrides the operator would reject, fail at install."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import ray
import yaml

from tests.conftest import REPO
from tests.deploy import chart_check
from tests.deploy.chart_check import CHART, crd_errors, problems, render

BROKEN = sorted((Path(__file__).parent / "broken").glob("*.yaml"))
VALUES = {"default": None, **{p.stem: p for p in sorted((CHART / "ci").glob("*.yaml"))}}


@pytest.fixture(scope="session")
def helm_bin(pytestconfig):
    binary = chart_check.helm_binary(chart_check.tools_dir(pytestconfig))
    assert "v4." in chart_check.helm(binary, "version", "--short").stdout
    return binary


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def pinned_ray_version() -> str:
    """The ``ray[...]==X.Y.Z`` pin of pyproject.toml (no tomllib: Python 3.10 is supported)."""
    text = (REPO / "pyproject.toml").read_text()
    (version,) = re.findall(r'^\s*"ray\[[^\]]*\]==([0-9.]+)"', text, re.M)
    return version


@pytest.mark.parametrize("name", list(VALUES))
def test_chart_lints_renders_and_matches_the_kuberay_crds(helm_bin, name):
    assert problems(helm_bin, VALUES[name]) == []
    assert {"default", "gpu-values", "rayjob-values", "s3-secret-values"} <= set(VALUES)


def head_and_groups(cluster_spec: dict) -> tuple[dict, dict[str, dict]]:
    return cluster_spec["headGroupSpec"], {g["groupName"]: g for g in
                                          cluster_spec["workerGroupSpecs"]}


def container(group: dict) -> dict:
    (c,) = group["template"]["spec"]["containers"]
    return c


def test_default_values_render_a_raycluster_for_submitted_jobs(helm_bin):
    objects = by_kind(render(helm_bin))
    assert sorted(objects) == ["ConfigMap", "NetworkPolicy", "RayCluster", "Service",
                               "ServiceAccount"]                         # no PDB by default
    (cluster,) = objects["RayCluster"]
    spec = cluster["spec"]
    assert spec["rayVersion"] == pinned_ray_version() == ray.__version__
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    assert spec["upgradeStrategy"] == {"type": "Recreate"}    # old and new images never mix
    assert spec["authOptions"] == {"mode": "token"}
    head, groups = head_and_groups(spec)
    assert head["rayStartParams"]["num-cpus"] == "0"          # no work on the head
    assert {p["name"]: p["containerPort"] for p in container(head)["ports"]} == {
        "gcs": 6379, "dashboard": 8265, "client": 10001, "metrics": 8080}
    assert list(groups) == ["cpu"]                            # gpu group off by default
    assert (groups["cpu"]["minReplicas"], groups["cpu"]["maxReplicas"]) == (0, 16)
    (service,) = objects["Service"]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "ray-head"
    assert head["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
    assert [p["name"] for p in service["spec"]["ports"]] == ["dashboard"]    # no metrics
    (configmap,) = objects["ConfigMap"]
    job = yaml.safe_load(configmap["data"]["job.yaml"])
    assert job["source"]["uri"].startswith("s3://") and job["sink"]["uri"].startswith("s3://")
    mounts = container(head)["volumeMounts"]
    assert {"name": "jobspec", "mountPath": "/home/ray/jobspec", "readOnly": True} in mounts


def test_gpu_values_add_an_autoscaled_gpu_group(helm_bin):
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["RayCluster"]
    _, groups = head_and_groups(cluster["spec"])
    gpu = groups["gpu"]
    assert (gpu["minReplicas"], gpu["maxReplicas"]) == (0, 8)
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    pod = gpu["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert "nvidia.com/gpu" not in json.dumps(groups["cpu"])
    # PartitionWorkers of the chart's job specs ask for mmpipe_cpu: only the CPU group has it
    assert groups["cpu"]["resources"] == {"mmpipe_cpu": "1000"}
    assert "resources" not in gpu
    (configmap,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["ConfigMap"]
    job = yaml.safe_load(configmap["data"]["job.yaml"])
    assert job["runtime"]["worker_resources"] == {"mmpipe_cpu": 1}


def test_rayjob_values_render_a_resumable_rayjob(helm_bin):
    objects = by_kind(render(helm_bin, VALUES["rayjob-values"]))
    assert "RayCluster" not in objects
    (job,) = objects["RayJob"]
    spec = job["spec"]
    assert spec["entrypoint"] == ("python -m pipeline run /home/ray/jobspec/job.yaml "
                                  "--set runtime.num_workers=32")
    assert (spec["shutdownAfterJobFinishes"], spec["ttlSecondsAfterFinished"],
            spec["backoffLimit"]) == (True, 3600, 2)
    head, groups = head_and_groups(spec["rayClusterSpec"])
    accounts = {a["metadata"]["name"]: a for a in objects["ServiceAccount"]}
    assert sorted(accounts) == ["mmpipe", "mmpipe-head"]       # one per role (name: workers)
    for account in accounts.values():
        assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
            "arn:aws:iam")
    assert head["template"]["spec"]["serviceAccountName"] == "mmpipe-head"
    assert "automountServiceAccountToken" not in head["template"]["spec"]   # the autoscaler
    for group in groups.values():
        assert group["template"]["spec"]["serviceAccountName"] == "mmpipe"
        assert group["template"]["spec"]["automountServiceAccountToken"] is False
    for group in [head, *groups.values()]:
        env = {e["name"] for e in container(group)["env"]}
        assert "AWS_REGION" in env and "AWS_ACCESS_KEY_ID" not in env   # IRSA: no keys
    (service,) = objects["Service"]
    assert service["spec"]["selector"]["mmpipe.io/role"] == "job"


def test_s3_secret_values_inject_credentials_from_the_secret(helm_bin):
    (cluster,) = by_kind(render(helm_bin, VALUES["s3-secret-values"]))["RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    assert cluster["spec"]["authOptions"] == {"mode": "token", "secretName": "mmpipe-ray-token"}
    for group in [head, *groups.values()]:
        env = {e["name"]: e for e in container(group)["env"]}
        assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {
            "name": "mmpipe-s3", "key": "access-key"}
        assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage:9000"
    assert {"name": "RAY_GRAFANA_HOST", "value": "http://grafana.monitoring:80"} in \
        container(head)["env"]


def test_closing_the_crd_schema_is_what_catches_a_misspelt_field(helm_bin):
    (cluster,) = by_kind(render(helm_bin))["RayCluster"]
    cluster["spec"]["workerGroupSpecs"][0]["minReplica"] = 1
    assert crd_errors(cluster, closed=False) == []           # the CRD as shipped accepts it
    (error,) = crd_errors(cluster)
    assert "workerGroupSpecs/0" in error and "'minReplica' was unexpected" in error


# --- what the operator accepts, PSS restricted, storage: every shipped values file and the
# overrides a user reasonably makes render something the operator accepts, or fail at
# `helm install` with a message (problems() runs the operator-rule port, the PSS
# "restricted" checks and the storage checks on everything rendered)

OVERRIDES = {
    "rayjob": ["rayJob.enabled=true"],
    "rayjob-only": ["rayJob.enabled=true", "rayCluster.enabled=false"],
    "rayjob-keep-cluster": ["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false"],
    "rayjob-kueue": ["rayJob.enabled=true", "rayJob.suspend=true",
                     "head.enableInTreeAutoscaling=false"],
    "rayjob-kueue-queue": ["rayJob.enabled=true", "rayJob.queueName=team-a",
                           "head.enableInTreeAutoscaling=false"],
    "rayjob-existing-cluster": ["rayJob.enabled=true", "rayJob.backoffLimit=0",
                                "rayJob.clusterSelector.ray\\.io/cluster=mmpipe"],
    "rayjob-http-mode": ["rayJob.enabled=true", "rayJob.submissionMode=HTTPMode"],
    "rayjob-interactive": ["rayJob.enabled=true", "rayJob.submissionMode=InteractiveMode",
                           "rayJob.backoffLimit=0"],
    "rayjob-deadlines": ["rayJob.enabled=true", "rayJob.preRunningDeadlineSeconds=600",
                         "rayJob.activeDeadlineSeconds=3600"],
    "rayjob-runtime-env": ["rayJob.enabled=true", "rayJob.runtimeEnvYAML=env_vars: {A: b}"],
    "rayjob-deletion-rules": ["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                              "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                              "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=SUCCEEDED",
                              "rayJob.deletionStrategy.deletionRules[0].condition.ttlSeconds=60"],
    "gpu-on": ["additionalWorkerGroups.gpu.disabled=false"],
    "gpu-idle-timeout": ["additionalWorkerGroups.gpu.disabled=false",
                         "additionalWorkerGroups.gpu.idleTimeoutSeconds=300"],
    "autoscaler-v1": ["head.autoscalerOptions.version=v1"],
    "no-autoscaling": ["head.enableInTreeAutoscaling=false"],
    "group-image-repository": ["worker.image.repository=registry.example/mmpipe-cpu"],
    "no-service-accounts": ["serviceAccount.create=false"],
    "existing-service-accounts": ["serviceAccount.create=false", "serviceAccount.name=w",
                                  "serviceAccount.headName=h"],
    "ingress-networkpolicy": ["ingress.enabled=true", "ingress.host=ray.example.com",
                              "networkPolicy.enabled=true",
                              ("networkPolicy.ingressFrom[0].namespaceSelector.matchLabels"
                               ".kubernetes\\.io/metadata\\.name=ingress-nginx")],
    "auth-disabled": ["auth.mode=disabled"],
    "object-store-given": ["worker.rayStartParams.object-store-memory=1000000000"],
}
# overrides the operator would reject: helm fails with this message instead
REJECTED = {
    "ray-resources-twice": (["worker.rayStartParams.resources=custom"],
                            "set rayResources or rayStartParams.resources, not both"),
    "min-above-max": (["worker.minReplicas=5", "worker.maxReplicas=2"],
                      "minReplicas (5) is greater than maxReplicas (2)"),
    "idle-timeout-on-v1": (["head.autoscalerOptions.version=v1", "worker.idleTimeoutSeconds=60"],
                           "idleTimeoutSeconds needs autoscaler v2"),
    "idle-timeout-no-autoscaler": (["head.enableInTreeAutoscaling=false",
                                    "worker.idleTimeoutSeconds=60"],
                                   "idleTimeoutSeconds needs autoscaler v2"),
    "suspend-keep-cluster": (["rayJob.enabled=true", "rayJob.suspend=true",
                              "rayJob.shutdownAfterJobFinishes=false"],
                             "rayJob.suspend=true needs rayJob.shutdownAfterJobFinishes=true"),
    "interactive-retries": (["rayJob.enabled=true", "rayJob.submissionMode=InteractiveMode"],
                            "rayJob.backoffLimit must be 0 with submissionMode InteractiveMode"),
    "selector-sidecar": (["rayJob.enabled=true", "rayJob.submissionMode=SidecarMode",
                          "rayJob.clusterSelector.ray\\.io/cluster=x"],
                         "not supported with submissionMode SidecarMode"),
    "selector-with-retries": (["rayJob.enabled=true", "rayJob.clusterSelector.ray\\.io/cluster=x"],
                              "needs rayJob.backoffLimit=0"),
    "deletion-rule-without-status": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                      "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                      "rayJob.deletionStrategy.deletionRules[0].condition.ttlSeconds=9"],
                                     "needs exactly one of jobStatus and jobDeploymentStatus"),
    "delete-workers-autoscaling": (["rayJob.enabled=true", "rayJob.shutdownAfterJobFinishes=false",
                                    "rayJob.deletionStrategy.deletionRules[0].policy=DeleteWorkers",
                                    "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED"],
                                   "DeleteWorkers is not supported with autoscaling"),
    "deletion-rules-with-shutdown": (["rayJob.enabled=true",
                                      "rayJob.deletionStrategy.deletionRules[0].policy=DeleteCluster",
                                      "rayJob.deletionStrategy.deletionRules[0].condition.jobStatus=FAILED"],
                                     "needs rayJob.shutdownAfterJobFinishes=false"),
    "bad-runtime-env": (["rayJob.enabled=true", "rayJob.runtimeEnvYAML=a: [b"],
                        "rayJob.runtimeEnvYAML is not valid YAML"),
    "ray-start-labels": (["worker.rayStartParams.labels=a=b"], "labels"),
    "autoscaler-v2-env": (["head.containerEnv[0].name=RAY_enable_autoscaler_v2",
                           "head.containerEnv[0].value=1"], "RAY_enable_autoscaler_v2"),
    "old-ray-with-token": (["head.rayVersion=2.50.0"], "needs Ray 2.52.0 or later"),
    "head-loadbalancer": (["head.serviceType=LoadBalancer"], "serviceType"),
    "ingress-without-service": (["ingress.enabled=true", "dashboardService.enabled=false"],
                                "ingress.enabled needs dashboardService.enabled"),
    "job-spec-field": (["jobSpec.spec.resize.size_px=-3"], "size_px"),
    "job-spec-typo": (["jobSpec.spec.resize.size=3"], "'size' not allowed"),
}


@pytest.mark.parametrize("name", list(OVERRIDES))
def test_reasonable_overrides_render_what_the_operator_accepts(helm_bin, name):
    assert problems(helm_bin, None, *OVERRIDES[name]) == []


@pytest.mark.parametrize("name", list(REJECTED))
def test_overrides_the_operator_would_reject_fail_at_install(helm_bin, name):
    sets, message = REJECTED[name]
    found = problems(helm_bin, None, *sets)
    assert found and any(message in p for p in found), found


@pytest.mark.parametrize("release", ["1st-run", "9"])
def test_a_release_name_kuberay_rejects_fails_at_install(helm_bin, release):
    (found,) = problems(helm_bin, None, "rayJob.enabled=true", release=release)
    assert "must be a DNS-1035 label" in found


def test_a_long_release_name_gives_a_rayjob_name_within_kuberays_limit(helm_bin):
    release = "nightly-curation-of-the-coco-dataset-for-training"      # 49 characters
    assert problems(helm_bin, None, "rayJob.enabled=true", release=release) == []
    (job,) = by_kind(render(helm_bin, None, "rayJob.enabled=true", release=release))["RayJob"]
    assert len(job["metadata"]["name"]) <= chart_check.MAX_RAYJOB_NAME
    assert job["metadata"]["name"].endswith("-job")


def test_the_operator_rule_port_catches_what_the_old_chart_rendered(helm_bin):
    """The findings of issue 14, replayed on rendered objects: each is reported."""
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["RayCluster"]
    del cluster["spec"]["autoscalerOptions"]["version"]            # the old default: v1
    assert any("idleTimeoutSeconds is set, but autoscaler v2 is not enabled" in e
               for e in chart_check.operator_errors(cluster))
    cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] = 99
    assert any("minReplicas 99 greater than maxReplicas" in e
               for e in chart_check.operator_errors(cluster))
    (job,) = by_kind(render(helm_bin, None, "rayJob.enabled=true"))["RayJob"]
    job["spec"]["shutdownAfterJobFinishes"] = False                # TTL 3600 stays
    assert any("cannot have TTLSecondsAfterFinished" in e for e in chart_check.operator_errors(job))
    job["metadata"]["name"] = "1" + "x" * 50
    assert len([e for e in chart_check.operator_errors(job) if "name should" in e]) == 2
    job["spec"]["clusterSelector"] = {"ray.io/cluster": "other"}           # retries: 2
    assert any("BackoffLimit is incompatible with ClusterSelector" in e
               for e in chart_check.operator_errors(job))
    del job["spec"]["clusterSelector"]
    job["spec"]["deletionStrategy"] = {"deletionRules": [
        {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "ttlSeconds": 10}},
        {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}}]}
    assert any("DeleteSelf TTL (10) must be >= DeleteCluster TTL (60)" in e
               for e in chart_check.operator_errors(job))


def test_rayjob_with_the_cluster_kept_has_no_ttl(helm_bin):
    (job,) = by_kind(render(helm_bin, None, *OVERRIDES["rayjob-keep-cluster"]))["RayJob"]
    assert job["spec"]["shutdownAfterJobFinishes"] is False
    assert "ttlSecondsAfterFinished" not in job["spec"]


def test_pss_restricted_check_catches_a_privileged_or_root_pod(helm_bin):
    objects = render(helm_bin)
    assert chart_check.pss_restricted_errors(objects) == []
    (cluster,) = by_kind(objects)["RayCluster"]
    pod = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["containers"][0]["securityContext"] = {"privileged": True}
    pod["securityContext"] = {}
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    cluster["spec"]["autoscalerOptions"].pop("securityContext")
    errors = "\n".join(chart_check.pss_restricted_errors(objects))
    for expected in ("privileged", "allowPrivilegeEscalation", "drop ALL", "runAsNonRoot",
                     "seccompProfile", "hostPath", "container autoscaler"):
        assert expected in errors, expected


def test_pod_settings_pass_through_with_restricted_defaults(helm_bin, tmp_path):
    values = tmp_path / "pass-through.yaml"
    values.write_text(yaml.safe_dump({
        "head": {"priorityClassName": "high", "serviceAccountName": "own-head"},
        "worker": {
            "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
            "sidecarContainers": [{"name": "log", "image": "fluent-bit"}],
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                           "whenUnsatisfiable": "ScheduleAnyway"}],
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
            "runtimeClassName": "gvisor",
            "podSecurityContext": {"fsGroupChangePolicy": "OnRootMismatch"}}}))
    assert problems(helm_bin, values) == []
    (cluster,) = by_kind(render(helm_bin, values))["RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    assert head["template"]["spec"]["priorityClassName"] == "high"
    assert head["template"]["spec"]["serviceAccountName"] == "own-head"
    pod = groups["cpu"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["ray-worker", "log"]   # Ray's first
    assert pod["initContainers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert pod["securityContext"]["runAsNonRoot"] is True                    # merged


def test_a_group_image_override_keeps_the_top_level_tag(helm_bin):
    (cluster,) = by_kind(render(helm_bin, None, *OVERRIDES["group-image-repository"]))[
        "RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    assert container(groups["cpu"])["image"] == "registry.example/mmpipe-cpu:0.1.0"
    assert container(head)["image"] == "mmpipe:0.1.0"


def test_entrypoint_arguments_are_shell_quoted(helm_bin):
    args = ["--set", "name=it's a job", "--set", "source.uri=s3://b/a b;rm -rf /"]
    sets = ["rayJob.enabled=true"] + [f"rayJob.entrypointArgs[{i}]={a}" for i, a in enumerate(args)]
    (job,) = by_kind(render(helm_bin, None, *sets))["RayJob"]
    words = shlex.split(job["spec"]["entrypoint"])
    assert words == ["python", "-m", "pipeline", "run", "/home/ray/jobspec/job.yaml", *args]


def test_rayjob_fields_render(helm_bin):
    sets = (OVERRIDES["rayjob-deadlines"] + ["rayJob.suspend=true",
            "head.enableInTreeAutoscaling=false", "rayJob.runtimeEnvYAML=env_vars: {A: b}"])
    (job,) = by_kind(render(helm_bin, None, *sets))["RayJob"]
    spec = job["spec"]
    assert (spec["preRunningDeadlineSeconds"], spec["activeDeadlineSeconds"],
            spec["suspend"]) == (600, 3600, True)
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {"A": "b"}}
    submitter = spec["submitterPodTemplate"]["spec"]
    assert submitter["restartPolicy"] == "Never"
    assert submitter["containers"][0]["image"] == "mmpipe:0.1.0"
    objects = by_kind(render(helm_bin, None, *OVERRIDES["rayjob-existing-cluster"]))
    (job,) = objects["RayJob"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "mmpipe"}
    assert "rayClusterSpec" not in job["spec"]


def test_storage_volumes_and_head_disruption_budget(helm_bin):
    objects = by_kind(render(helm_bin, VALUES["gpu-values"], "headDisruptionBudget.enabled=true"))
    (cluster,) = objects["RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    for group in [head, *groups.values()]:
        mounts = {m["mountPath"]: m["name"] for m in container(group)["volumeMounts"]}
        assert {"/tmp/ray", "/scratch"} <= set(mounts) and "/dev/shm" not in mounts
        assert mounts["/tmp/ray"] == "ray-logs"     # KubeRay's name: the autoscaler shares it
        env = {e["name"]: e.get("value") for e in container(group)["env"]}
        assert env["TMPDIR"] == "/scratch" and env["HF_HOME"].startswith("/scratch/")
    annotations = head["template"]["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    (pdb,) = objects["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 0
    assert head["template"]["metadata"]["labels"].items() >= \
        pdb["spec"]["selector"]["matchLabels"].items()
    assert not any(g["template"]["metadata"]["labels"].items() >=
                   pdb["spec"]["selector"]["matchLabels"].items() for g in groups.values())
    # an 8Gi /dev/shm (the old GPU values) cannot hold Ray's object store of a 48Gi pod
    gpu = groups["gpu"]["template"]["spec"]
    gpu["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}})
    gpu["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    (error,) = chart_check.storage_errors([cluster])
    assert "14.4 GiB) does not fit /dev/shm (8.0 GiB)" in error


def test_ingress_and_networkpolicy(helm_bin):
    objects = by_kind(render(helm_bin, None, *OVERRIDES["ingress-networkpolicy"]))
    (ingress,) = objects["Ingress"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "ray.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": objects["Service"][0]["metadata"]["name"],
                       "port": {"name": "dashboard"}}
    policy, _ = objects["NetworkPolicy"]
    ports = [[p["port"] for p in r.get("ports", [])] for r in policy["spec"]["ingress"]]
    assert ports == [[], [8265], [8080]]
    assert all(r["from"] for r in policy["spec"]["ingress"])    # no rule open to everyone


def test_values_schema_embeds_the_current_job_spec_schema():
    """values.schema.json's job spec schema is the one pipeline/spec/ generates now
    (refresh: .venv/bin/python helm/sync_jobspec_schema.py)."""
    sync = _load_sync()
    current = (CHART / "values.schema.json").read_text()
    assert current == sync.render(sync.synced(json.loads(current))), \
        "stale: run .venv/bin/python helm/sync_jobspec_schema.py"


def _load_sync():
    spec = importlib.util.spec_from_file_location("sync_jobspec_schema",
                                                  REPO / "helm" / "sync_jobspec_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("values", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_values_fail(helm_bin, values):
    expected = re.search(r"^# expect: (.+)$", values.read_text(), re.M).group(1)
    found = problems(helm_bin, values)
    assert found, f"{values.name} passed every check"
    assert any(expected in p for p in found), found


def test_values_schema_documents_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    undocumented = []

    def walk(node, path):
        for key, sub in node.get("properties", {}).items():
            if "description" not in sub and "$ref" not in sub:
                undocumented.append(f"{path}{key}")
            walk(sub, f"{path}{key}.")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}*.")
    walk({"properties": {k: v for k, v in schema["properties"].items() if k != "jobSpec"}}, "")
    walk(schema["properties"]["jobSpec"], "jobSpec.")       # the JobSpec schema: pydantic's
    assert undocumented == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])


def test_podmonitor_selects_the_charts_ray_pods_by_their_metrics_port(helm_bin):
    objects = by_kind(render(helm_bin, VALUES["gpu-values"], "monitoring.podMonitor.enabled=true"))
    (monitor,) = objects["PodMonitor"]                      # the chart's (monitoring.podMonitor)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (cluster,) = objects["RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    for group in [head, *groups.values()]:
        assert group["template"]["metadata"]["labels"].items() >= selector.items()
        ports = {p["name"]: p["containerPort"] for p in container(group)["ports"]}
        assert ports[endpoint["port"]] == int(head["rayStartParams"]["metrics-export-port"])
