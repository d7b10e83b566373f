"""The Helm chart, checked with the real ``helm`` v4 binary and the KubeRay CRD schemas:
lint and render the default, GPU, RayJob and S3-secret values; validate every RayCluster and
RayJob against the closed CRD schemas; and make sure deliberately broken values fail."""

from __future__ import annotations

import json
import re
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
    binary = chart_check.helm_binary(pytestconfig.cache.mkdir("mmpipe-tools"))
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
    assert sorted(objects) == ["ConfigMap", "RayCluster", "Service"]
    (cluster,) = objects["RayCluster"]
    spec = cluster["spec"]
    assert spec["rayVersion"] == pinned_ray_version() == ray.__version__
    assert spec["enableInTreeAutoscaling"] is True
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
    (sa,) = objects["ServiceAccount"]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam")
    for group in [head, *groups.values()]:
        pod = group["template"]["spec"]
        assert pod["serviceAccountName"] == sa["metadata"]["name"]
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
    walk(schema, "")
    assert undocumented == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])


def test_podmonitor_selects_the_charts_ray_pods_by_their_metrics_port(helm_bin):
    monitor = yaml.safe_load((REPO / "deploy" / "prometheus" / "podmonitor.yaml").read_text())
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["RayCluster"]
    head, groups = head_and_groups(cluster["spec"])
    for group in [head, *groups.values()]:
        assert group["template"]["metadata"]["labels"].items() >= selector.items()
        ports = {p["name"]: p["containerPort"] for p in container(group)["ports"]}
        assert ports[endpoint["port"]] == int(head["rayStartParams"]["metrics-export-port"])
