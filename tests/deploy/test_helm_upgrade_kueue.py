"""Issue 28, points 2, 4, 5, 8 and 9, checked on the chart rendered by the real ``helm``.

Point 2: the operator floor is KubeRay 1.6.0 (authOptions.secretName, upgradeStrategy), said
the same in Chart.yaml, the chart README, NOTES, and the operator install is pinned. Point 4:
``replicas`` is left to the autoscaler (omitted for autoscaled groups), and the RayCluster's
``upgradeStrategy`` defaults to Recreate. Point 5: ``rayJob.queueName`` (Kueue) renders the
queue label and needs a non-autoscaling cluster, with Kueue's RayJob webhook ported in
``chart_check.kueue_errors``. Point 8: GPU groups get a required node affinity for the NVIDIA
driver floor (CUDA 13: driver >= 580). Point 9: the docs match what is built and rendered."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.conftest import REPO
from tests.deploy import chart_check
from tests.deploy.chart_check import CHART, problems, render
from tests.deploy.test_helm import VALUES, by_kind, head_and_groups

FLOOR = (1, 6, 0)
DRIVER_LABEL = "nvidia.com/cuda.driver-version.major"
KUEUE = ["rayJob.enabled=true", "rayJob.queueName=team-a", "head.enableInTreeAutoscaling=false"]


@pytest.fixture(scope="module")
def helm_bin(pytestconfig):
    return chart_check.helm_binary(chart_check.tools_dir(pytestconfig))


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def shell_commands(markdown: str) -> list[str]:
    """The commands of the ```bash blocks, backslash continuations joined."""
    blocks = re.findall(r"```bash\n(.*?)```", markdown, re.DOTALL)
    return [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines()
            if c.strip() and not c.strip().startswith("#")]


def notes(helm_bin, *sets: str, release: str = "mmpipe") -> str:
    """NOTES.txt as ``helm install`` prints it (a client-side dry run: no cluster)."""
    done = chart_check.helm(helm_bin, "install", release, str(CHART), "--dry-run=client",
                            *chart_check.values_args(None, sets))
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\nNOTES:\n", 1)[1]


def refused(helm_bin, *sets: str) -> str:
    with pytest.raises(RuntimeError) as error:
        render(helm_bin, None, *sets)
    return str(error.value)


def groups_of(obj: dict) -> dict[str, dict]:
    spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
    return head_and_groups(spec)[1]


# --- point 2: the operator floor ----------------------------------------------------------


def test_the_operator_floor_is_kuberay_1_6_0_everywhere_and_the_install_is_pinned(helm_bin):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["kuberay.io/operator-version"] == ">=1.6.0"
    readme = (CHART / "README.md").read_text()
    assert "Needs the KubeRay operator 1.6.0 or later" in readme
    for path in [CHART / "Chart.yaml", CHART / "README.md", CHART / "values.yaml",
                 CHART / "templates" / "NOTES.txt"]:
        assert not re.search(r">=\s*1\.5|1\.5 or later", path.read_text()), path
    (install,) = [c for c in shell_commands(readme)
                  if c.startswith("helm install kuberay-operator kuberay/kuberay-operator")]
    pinned = re.search(r"--version (\d+\.\d+\.\d+)\b", install)
    assert pinned and version(pinned.group(1)) >= FLOOR, install
    assert "Needs the KubeRay operator 1.6.0 or later" in notes(helm_bin)


# --- point 4: upgrades --------------------------------------------------------------------


def test_autoscaled_groups_leave_replicas_to_the_autoscaler(helm_bin):
    for objects in (render(helm_bin), render(helm_bin, VALUES["gpu-values"]),
                    render(helm_bin, None, "rayJob.enabled=true")):
        ray = [o for o in objects if o["kind"] in ("RayCluster", "RayJob")]
        assert ray
        for obj in ray:
            groups = groups_of(obj)
            assert groups
            for name, group in groups.items():
                assert "replicas" not in group, (obj["kind"], name)
                assert {"minReplicas", "maxReplicas"} <= set(group)
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["RayCluster"]
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    assert (groups_of(cluster)["gpu"]["minReplicas"], groups_of(cluster)["gpu"]["maxReplicas"]) \
        == (0, 8)


def test_without_the_autoscaler_replicas_is_rendered_and_checked(helm_bin):
    sets = ["head.enableInTreeAutoscaling=false", "worker.replicas=3", "worker.maxReplicas=4",
            "additionalWorkerGroups.gpu.disabled=false", "additionalWorkerGroups.gpu.replicas=2"]
    assert problems(helm_bin, None, *sets) == []
    (cluster,) = by_kind(render(helm_bin, None, *sets))["RayCluster"]
    groups = groups_of(cluster)
    assert (groups["cpu"]["replicas"], groups["gpu"]["replicas"]) == (3, 2)
    assert "replicas (9) must be between minReplicas (0) and maxReplicas (4)" in \
        refused(helm_bin, *sets[:1], "worker.replicas=9", "worker.maxReplicas=4")
    # with the autoscaler the value is not rendered, so it is not held against min/max
    assert problems(helm_bin, None, "worker.replicas=9", "worker.maxReplicas=4") == []


def test_upgrade_strategy_defaults_to_recreate_and_the_schema_refuses_other_values(helm_bin):
    (cluster,) = by_kind(render(helm_bin))["RayCluster"]
    assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}
    (cluster,) = by_kind(render(helm_bin, None, "rayCluster.upgradeStrategy=None"))["RayCluster"]
    assert cluster["spec"]["upgradeStrategy"] == {"type": "None"}
    assert problems(helm_bin, None, "rayCluster.upgradeStrategy=None") == []
    message = refused(helm_bin, "rayCluster.upgradeStrategy=RollingUpdate")
    assert "/rayCluster/upgradeStrategy" in message and "'Recreate'" in message
    # a RayJob's cluster takes none (KubeRay refuses one there)
    (job,) = by_kind(render(helm_bin, None, "rayJob.enabled=true"))["RayJob"]
    assert "upgradeStrategy" not in job["spec"]["rayClusterSpec"]
    readme = (CHART / "README.md").read_text()
    assert "## Upgrades" in readme and "`Recreate` (the default)" in readme


# --- point 5: Kueue -----------------------------------------------------------------------


def test_a_kueue_rayjob_carries_the_queue_label_and_a_fixed_size_cluster(helm_bin):
    assert problems(helm_bin, None, *KUEUE) == []
    assert problems(helm_bin, VALUES["rayjob-values"], *KUEUE[1:]) == []
    (job,) = by_kind(render(helm_bin, None, *KUEUE))["RayJob"]
    assert job["metadata"]["labels"][chart_check.KUEUE_QUEUE_LABEL] == "team-a"
    spec = job["spec"]
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    assert spec["shutdownAfterJobFinishes"] is True
    assert groups_of(job)["cpu"]["replicas"] == 1          # what Kueue reserves quota for
    assert chart_check.kueue_errors(job) == []
    (job,) = by_kind(render(helm_bin, None, "rayJob.enabled=true"))["RayJob"]
    assert chart_check.KUEUE_QUEUE_LABEL not in job["metadata"]["labels"]


def test_the_kueue_port_reports_what_kueues_webhook_refuses(helm_bin):
    (job,) = by_kind(render(helm_bin, None, *KUEUE))["RayJob"]
    job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True     # the old default
    job["spec"]["shutdownAfterJobFinishes"] = False
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] = "head"
    found = "\n".join(chart_check.kueue_errors(job))
    for expected in ("should not use autoscaling", "should delete the cluster after finishing",
                     '"head" is reserved'):
        assert expected in found


KUEUE_REFUSED = {
    "queue-autoscaling": (
        ["rayJob.enabled=true", "rayJob.queueName=team-a"],
        "rayJob.queueName=team-a (Kueue) needs head.enableInTreeAutoscaling=false"),
    "suspend-autoscaling": (
        ["rayJob.enabled=true", "rayJob.suspend=true"],
        "rayJob.suspend=true (the Kueue path) needs head.enableInTreeAutoscaling=false"),
    "queue-keeps-cluster": (
        [*KUEUE, "rayJob.shutdownAfterJobFinishes=false"],
        "rayJob.queueName=team-a (Kueue) needs rayJob.shutdownAfterJobFinishes=true"),
    "queue-existing-cluster": (
        [*KUEUE, "rayJob.backoffLimit=0", "rayJob.clusterSelector.ray\\.io/cluster=mmpipe"],
        "rayJob.queueName=team-a (Kueue) cannot be combined with rayJob.clusterSelector"),
    "queue-group-named-head": (
        [*KUEUE, "worker.groupName=head"],
        'rayJob.queueName=team-a (Kueue): no worker group may be named "head"'),
}


@pytest.mark.parametrize("name", list(KUEUE_REFUSED))
def test_what_kueue_refuses_fails_at_install_naming_the_values(helm_bin, name):
    sets, message = KUEUE_REFUSED[name]
    assert message in refused(helm_bin, *sets)


# --- point 8: the GPU driver floor --------------------------------------------------------


def driver_terms(group: dict) -> list[list[dict]]:
    affinity = group["template"]["spec"].get("affinity") or {}
    required = affinity.get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    return [t.get("matchExpressions", []) for t in (required or {}).get("nodeSelectorTerms", [])]


def test_gpu_groups_require_a_node_with_the_cuda_13_driver(helm_bin):
    floor = {"key": DRIVER_LABEL, "operator": "Gt", "values": ["579"]}
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"]))["RayCluster"]
    groups = groups_of(cluster)
    assert driver_terms(groups["gpu"]) == [[floor]]
    assert "affinity" not in groups["cpu"]["template"]["spec"]       # no GPU, no floor
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"],
                                "gpuDriver.nodeAffinity=false"))["RayCluster"]
    assert "affinity" not in groups_of(cluster)["gpu"]["template"]["spec"]
    no_gpu = [f"additionalWorkerGroups.gpu.resources.{k}.nvidia\\.com/gpu=0"
              for k in ("limits", "requests")]
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"], *no_gpu))["RayCluster"]
    assert "affinity" not in groups_of(cluster)["gpu"]["template"]["spec"]
    (cluster,) = by_kind(render(helm_bin, VALUES["gpu-values"], "gpuDriver.minMajor=590",
                                "gpuDriver.label=nvidia.com/cuda.driver.major"))["RayCluster"]
    assert driver_terms(groups_of(cluster)["gpu"]) == [[
        {"key": "nvidia.com/cuda.driver.major", "operator": "Gt", "values": ["589"]}]]


def test_the_driver_floor_is_anded_into_the_groups_own_affinity(helm_bin, tmp_path):
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    own = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [zone]}, {"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [zone]}}]}}
    values = tmp_path / "own-affinity.yaml"
    values.write_text(yaml.safe_dump({"additionalWorkerGroups": {"gpu": {"affinity": own}}}))
    assert problems(helm_bin, values, "additionalWorkerGroups.gpu.disabled=false") == []
    (cluster,) = by_kind(render(helm_bin, values, "additionalWorkerGroups.gpu.disabled=false"))[
        "RayCluster"]
    gpu = groups_of(cluster)["gpu"]
    floor = {"key": DRIVER_LABEL, "operator": "Gt", "values": ["579"]}
    assert driver_terms(gpu) == [[zone, floor], [floor]]       # each term (ORed) gets it
    node = gpu["template"]["spec"]["affinity"]["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][1][
        "matchFields"][0]["values"] == ["gpu-1"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == \
        own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]


# --- point 9: docs drift ------------------------------------------------------------------


def test_the_gpu_values_use_the_tag_the_dockerfile_and_readme_build():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG VARIANT=gpu$", dockerfile, re.MULTILINE)   # GPU: the default build
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]  # the user guide too
    builds = [c for doc in docs for c in shell_commands(doc.read_text())
              if c.startswith("docker build")]
    default_tags = {m.group(1) for c in builds if "VARIANT=" not in c
                    for m in [re.search(r"-t \S+/mmpipe:(\S+)", c)] if m}
    gpu = yaml.safe_load(VALUES["gpu-values"].read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert gpu["image"]["tag"] == chart["appVersion"]
    assert gpu["image"]["tag"] in default_tags, (gpu["image"]["tag"], default_tags)


def check_name(name: str) -> str:
    """KubeRay's utils.CheckName (v1.6, v1.7), which names the generated auth token Secret."""
    name = name[-50:]
    return "r" + name[1:] if name[0].isdigit() or name[0] == "-" else name


@pytest.mark.parametrize("release", ["mmpipe", "nightly-curation-of-the-coco-dataset-for-training"])
def test_notes_say_where_the_operator_generated_token_lives(helm_bin, release):
    (cluster,) = by_kind(render(helm_bin, release=release))["RayCluster"]
    secret = check_name(cluster["metadata"]["name"])
    text = notes(helm_bin, release=release)
    assert (f"export RAY_AUTH_TOKEN=$(kubectl get secret {secret} -n default "
            "-o jsonpath='{.data.auth_token}' | base64 -d)") in text
    if release != "mmpipe":
        assert secret != cluster["metadata"]["name"] and len(secret) == 50


def test_notes_name_the_token_secret_of_a_rayjob_and_a_given_secret(helm_bin):
    text = notes(helm_bin, "rayJob.enabled=true", "rayCluster.enabled=false")
    assert ("kubectl get secret -n default -l ray.io/cluster=$(kubectl get rayjob mmpipe-job "
            "-n default -o jsonpath='{.status.rayClusterName}')") in text
    assert "kubectl get secret mmpipe " not in text                 # no RayCluster of its own
    text = notes(helm_bin, "auth.secretName=mmpipe-ray-token")
    assert "kubectl get secret mmpipe-ray-token -n default" in text
    assert "generated" not in text
    assert "RAY_AUTH_TOKEN" not in notes(helm_bin, "auth.mode=disabled")


def test_every_chart_readme_install_overrides_the_image_and_uses_ray_resources():
    readme = (CHART / "README.md").read_text()
    installs = [c for c in shell_commands(readme) if re.match(r"helm install \S+ helm/mmpipe", c)]
    assert any("ci/rayjob-values.yaml" in c for c in installs)        # the RayJob quickstart
    for command in installs:
        assert "--set image.repository=" in command and "--set image.tag=" in command, command
    # custom Ray resources: rayResources; rayStartParams.resources only as what is refused
    assert "Custom Ray resources of a group go in its `rayResources`" in " ".join(readme.split())
    guide = [p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]]
    for doc in (readme, (CHART / "values.yaml").read_text(), *guide):
        for sentence in re.split(r"(?<=\.)\s", doc):
            if "rayStartParams.resources" in sentence:
                assert re.search(r"\bnot\b|refuse|reject", sentence), sentence
