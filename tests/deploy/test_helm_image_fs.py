"""The chart's supply-chain and filesystem defaults (issue 28), rendered with the real helm v4:
``image.digest`` pins every pod's image; the root filesystem of every container is read-only,
with an emptyDir at each path Ray and mmpipe write (the paths computed with Ray's and
mmpipe's own code from the rendered environment); S3 credentials come from a Secret mounted
as an AWS shared credentials file, which boto3 and pyarrow (the AWS SDK for C++) read
against a real S3 API, with no key in the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import REPO
from tests.deploy import chart_check
from tests.deploy.chart_check import CHART, problems, render

DIGEST = "sha256:" + "0123456789abcdef" * 4
OTHER = "sha256:" + "fedcba9876543210" * 4
VALUES = {"default": None, **{p.stem: p for p in sorted((CHART / "ci").glob("*.yaml"))}}
WRITABLE = ("/tmp", "/tmp/ray", "/scratch", "/home/ray/.ray", "/home/ray/.cache",
            "/home/ray/.config")
SUBMITTER = ("/tmp", "/home/ray/.ray", "/home/ray/.cache", "/home/ray/.config")
CREDENTIALS = "/var/run/secrets/mmpipe/aws/credentials"


@pytest.fixture(scope="session")
def helm_bin(pytestconfig):
    return chart_check.helm_binary(pytestconfig.cache.mkdir("mmpipe-tools"))


def chart_pods(objects: list[dict]) -> list[tuple[str, dict, dict | None]]:
    """(where, pod template, autoscalerOptions or None) of every pod template the chart
    renders itself: head, each worker group, the RayJob submitter."""
    out = []
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata']['name']}"
        spec = obj["spec"] if obj["kind"] == "RayCluster" else \
            obj["spec"].get("rayClusterSpec") if obj["kind"] == "RayJob" else None
        if spec:
            scaler = spec.get("autoscalerOptions") if spec.get("enableInTreeAutoscaling") \
                else None
            out.append((f"{name} head", spec["headGroupSpec"]["template"], scaler))
            out += [(f"{name} {g['groupName']}", g["template"], None)
                    for g in spec.get("workerGroupSpecs") or []]
        if obj["kind"] == "RayJob" and obj["spec"].get("submitterPodTemplate"):
            out.append((f"{name} submitter", obj["spec"]["submitterPodTemplate"], None))
    return out


def containers(pod: dict) -> list[dict]:
    spec = pod["spec"]
    return (spec.get("initContainers") or []) + spec["containers"]


def writable_at(path: str, mounts: list[dict], volumes: dict[str, dict]) -> str | None:
    """The emptyDir volume a write to ``path`` lands on (its deepest mount), else None."""
    best = None
    for m in mounts:
        root = PurePosixPath(m["mountPath"])
        inside = PurePosixPath(path) == root or root in PurePosixPath(path).parents
        if inside and (best is None or
                       len(root.parts) > len(PurePosixPath(best["mountPath"]).parts)):
            best = m
    if best is None or best.get("readOnly") or "emptyDir" not in volumes.get(best["name"], {}):
        return None
    return best["name"]


def ray_temp_dir(env: dict[str, str], monkeypatch) -> str:
    """The directory Ray puts its session in (``ray start`` with no --temp-dir), from Ray's
    own code under the container's environment."""
    from ray._common.utils import get_default_ray_temp_dir

    for key in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(key, raising=False)
        if key in env:
            monkeypatch.setenv(key, env[key])
    return get_default_ray_temp_dir()


# --- image.digest --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "gpu-values", "rayjob-values"])
def test_image_digest_pins_every_container_of_the_mmpipe_image(helm_bin, name):
    objects = render(helm_bin, VALUES[name], f"image.digest={DIGEST}")
    repo = {"default": "mmpipe", "rayjob-values": "mmpipe"}.get(name, "ghcr.io/example/mmpipe")
    pods = chart_pods(objects)
    assert len(pods) >= 2
    for where, pod, _ in pods:
        for c in containers(pod):
            assert c["image"].startswith(f"{repo}:") and c["image"].endswith(f"@{DIGEST}"), \
                (where, c["name"], c["image"])
    # KubeRay's own containers copy the Ray container's image: the autoscaler (head) and
    # wait-gcs-ready (workers) run the same pinned reference
    for where, template in chart_check.pod_templates(objects):
        ray = template["spec"]["containers"][0]
        assert "image" not in ray or ray["image"].endswith(f"@{DIGEST}"), where
    assert problems(helm_bin, VALUES[name], f"image.digest={DIGEST}") == []


def test_image_digest_without_tag_and_per_group_images(helm_bin):
    objects = render(helm_bin, None, f"image.digest={DIGEST}", "image.tag=",
                     "worker.image.repository=registry.example/mmpipe-cpu",
                     "worker.image.tag=0.2.0",
                     "additionalWorkerGroups.gpu.disabled=false",
                     f"additionalWorkerGroups.gpu.image.digest={OTHER}")
    images = {where: pod["spec"]["containers"][0]["image"]
              for where, pod, _ in chart_pods(objects)}
    assert images == {"RayCluster mmpipe head": f"mmpipe@{DIGEST}",
                      # another repository: image.digest is not its digest
                      "RayCluster mmpipe cpu": "registry.example/mmpipe-cpu:0.2.0",
                      "RayCluster mmpipe gpu": f"mmpipe@{OTHER}"}
    # without a digest, by tag as before
    (cluster,) = [o for o in render(helm_bin) if o["kind"] == "RayCluster"]
    assert cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == \
        "mmpipe:0.1.0"


@pytest.mark.parametrize("key,value", [
    ("image.digest", "sha256:abc"),
    ("image.digest", "SHA256:" + "A" * 64),
    ("image.digest", "md5:" + "a" * 32),
    ("image.digest", "0123456789abcdef" * 4),              # no algorithm
    ("worker.image.digest", "sha256:" + "g" * 64),
    ("head.image.digest", "sha256:" + "a" * 63),
])
def test_a_bad_digest_is_refused_naming_the_value(helm_bin, key, value):
    with pytest.raises(RuntimeError) as e:
        render(helm_bin, None, f"{key}={value}")
    assert value in str(e.value) and key.replace(".", "/") in str(e.value)


def test_a_tag_that_holds_a_digest_and_a_digest_is_refused(helm_bin):
    with pytest.raises(RuntimeError, match="already holds a digest"):
        render(helm_bin, None, f"image.digest={DIGEST}", f"image.tag=0.1.0@{OTHER}")
    with pytest.raises(RuntimeError, match="neither a tag nor a digest"):
        render(helm_bin, None, "image.tag=")


# --- read-only root filesystem -------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUES))
def test_root_filesystem_is_read_only_with_an_emptydir_wherever_ray_writes(
        helm_bin, name, monkeypatch):
    objects = render(helm_bin, VALUES[name])
    assert problems(helm_bin, VALUES[name]) == []
    pods = chart_pods(objects)
    assert pods
    for where, pod, scaler in pods:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        for c in containers(pod):
            if c["name"] not in ("ray-head", "ray-worker", "ray-job-submitter"):
                continue
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (where, c["name"])
            mounts = c.get("volumeMounts") or []
            env = {e["name"]: e.get("value") for e in c.get("env") or []}
            paths = list(WRITABLE if c["name"] != "ray-job-submitter" else SUBMITTER)
            if c["name"] != "ray-job-submitter":
                # what Ray and mmpipe compute from this environment: Ray's session dir,
                # Python's tempfile dir, mmpipe's model cache
                session = ray_temp_dir(env, monkeypatch)
                assert session == "/tmp/ray", (where, session)      # KubeRay's ray-logs
                assert writable_at(session, mounts, volumes) == "ray-logs", where
                paths += [env["TMPDIR"], env["HF_HOME"], env["TORCH_HOME"],
                          "/home/ray/.cache/mmpipe/models"]
            for path in paths:
                assert writable_at(path, mounts, volumes), (where, c["name"], path)
        if scaler:       # KubeRay's autoscaler sidecar: its securityContext and mounts
            assert scaler["securityContext"]["readOnlyRootFilesystem"] is True, where
            mounts = scaler["volumeMounts"] + [{"name": "ray-logs", "mountPath": "/tmp/ray"}]
            for path in ("/tmp", "/tmp/ray", "/home/ray/.ray", "/home/ray/.cache"):
                assert writable_at(path, mounts, volumes), (where, "autoscaler", path)


def test_model_cache_default_lands_on_a_writable_mount(monkeypatch):
    """mmpipe's own default model cache (no MMPIPE_MODEL_CACHE) is under ~/.cache."""
    from pipeline.models import weights

    monkeypatch.delenv("MMPIPE_MODEL_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/ray")
    assert str(weights.cache_dir_for("s3://b/models/clip")).startswith("/home/ray/.cache/")


def test_read_only_root_filesystem_can_be_turned_off(helm_bin):
    sets = ("common.securityContext.readOnlyRootFilesystem=false",
            "head.autoscalerOptions.securityContext.readOnlyRootFilesystem=false")
    objects = render(helm_bin, VALUES["rayjob-values"], *sets)
    seen = 0
    for _, pod, _ in chart_pods(objects):
        for c in containers(pod):
            assert c["securityContext"]["readOnlyRootFilesystem"] is False
            seen += 1
    assert seen >= 3
    assert problems(helm_bin, VALUES["rayjob-values"], *sets) == []


# --- S3 credentials as a file --------------------------------------------------------------

def ray_containers(objects: list[dict]) -> list[tuple[str, dict, dict]]:
    return [(where, c, {v["name"]: v for v in pod["spec"].get("volumes") or []})
            for where, pod, _ in chart_pods(objects) for c in pod["spec"]["containers"]
            if c["name"] in ("ray-head", "ray-worker")]


def test_s3_secret_is_mounted_as_a_credentials_file_by_default(helm_bin):
    objects = render(helm_bin, None, "s3.credentialsSecret.name=mmpipe-s3",
                     "additionalWorkerGroups.gpu.disabled=false")
    found = ray_containers(objects)
    assert len(found) == 3
    for where, c, volumes in found:
        env = {e["name"]: e for e in c["env"]}
        assert env["AWS_SHARED_CREDENTIALS_FILE"]["value"] == CREDENTIALS, where
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
        assert not any("secretKeyRef" in str(e.get("valueFrom")) for e in c["env"]), where
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "aws-credentials"]
        assert mount == {"name": "aws-credentials", "mountPath": str(Path(CREDENTIALS).parent),
                         "readOnly": True}
        assert volumes["aws-credentials"] == {"name": "aws-credentials", "secret": {
            "secretName": "mmpipe-s3", "items": [{"key": "credentials", "path": "credentials"}]}}
    assert problems(helm_bin, None, "s3.credentialsSecret.name=mmpipe-s3") == []
    # another key of the Secret
    objects = render(helm_bin, None, "s3.credentialsSecret.name=s",
                     "s3.credentialsSecret.credentialsFileKey=aws.ini")
    for _, _, volumes in ray_containers(objects):
        assert volumes["aws-credentials"]["secret"]["items"] == [
            {"key": "aws.ini", "path": "credentials"}]


def test_s3_secret_env_mode_still_injects_the_keys(helm_bin):
    sets = ("s3.credentialsSecret.name=mmpipe-s3", "s3.credentialsSecret.mode=env",
            "s3.credentialsSecret.accessKeyIdKey=access-key",
            "s3.credentialsSecret.secretAccessKeyKey=secret-key",
            "s3.credentialsSecret.sessionTokenKey=token")
    for where, c, volumes in ray_containers(render(helm_bin, None, *sets)):
        env = {e["name"]: e for e in c["env"]}
        assert {k: env[k]["valueFrom"]["secretKeyRef"] for k in (
            "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")} == {
            "AWS_ACCESS_KEY_ID": {"name": "mmpipe-s3", "key": "access-key"},
            "AWS_SECRET_ACCESS_KEY": {"name": "mmpipe-s3", "key": "secret-key"},
            "AWS_SESSION_TOKEN": {"name": "mmpipe-s3", "key": "token"}}, where
        assert "AWS_SHARED_CREDENTIALS_FILE" not in env and "aws-credentials" not in volumes
    assert problems(helm_bin, None, *sets) == []
    with pytest.raises(RuntimeError, match="credentialsSecret/mode"):
        render(helm_bin, None, "s3.credentialsSecret.mode=both")
    # no Secret: no credentials at all (the service account's IAM role)
    for _, c, volumes in ray_containers(render(helm_bin)):
        assert not {e["name"] for e in c["env"]} & {
            "AWS_SHARED_CREDENTIALS_FILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert "aws-credentials" not in volumes


SDK_CHECK = r"""
import sys, uuid
from pipeline.storage import s3
uri = f"s3://{sys.argv[1]}/creds/{uuid.uuid4().hex}.json"
assert s3.put_if_absent(uri, b'{"ok": 1}')                           # boto3
assert not s3.put_if_absent(uri, b'{"ok": 2}')
with s3.filesystem().open_input_stream(uri.removeprefix("s3://")) as f:    # pyarrow, C++ SDK
    assert f.read() == b'{"ok": 1}'
with s3.filesystem().open_output_stream(uri.removeprefix("s3://") + ".2") as f:
    f.write(b"two")
print("ok", len(s3.list_page(f"s3://{sys.argv[1]}/creds/", None)[0]))
"""


def test_pipeline_s3_clients_read_the_mounted_credentials_file(s3_server, tmp_path):
    """The chart's file mode against a real S3 API: boto3 and pyarrow's S3FileSystem
    (the AWS SDK for C++) authenticate from AWS_SHARED_CREDENTIALS_FILE alone, in a process
    with no AWS key in its environment; without the file they are refused."""
    from pipeline.testing.seaweedfs import ACCESS_KEY, SECRET_KEY

    bucket = f"t-{os.urandom(6).hex()}"
    s3_server.client().create_bucket(Bucket=bucket)
    creds = tmp_path / "secret" / "credentials"            # the Secret's key, as mounted
    creds.parent.mkdir()
    creds.write_text(f"[default]\naws_access_key_id = {ACCESS_KEY}\n"
                     f"aws_secret_access_key = {SECRET_KEY}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_ENDPOINT_URL=s3_server.endpoint_url,
               AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=str(tmp_path / "no-config"), PYTHONPATH=str(REPO))
    run = [sys.executable, "-c", SDK_CHECK, bucket]
    done = subprocess.run(run, env=dict(env, AWS_SHARED_CREDENTIALS_FILE=str(creds)),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "2"]
    refused = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, check=False)
    assert refused.returncode != 0 and ("NoCredentials" in refused.stderr
                                        or "AccessDenied" in refused.stderr), refused.stderr


@pytest.mark.parametrize("env", [{}, {"TMPDIR": "/scratch"}, {"RAY_TMPDIR": "/tmp"},
                                 {"TMPDIR": "/scratch", "RAY_TMPDIR": "/tmp"}])
def test_chart_checks_session_dir_rule_is_rays(env, monkeypatch):
    assert chart_check.ray_session_dir(env) == ray_temp_dir(env, monkeypatch)


def test_chart_check_reports_ray_writing_outside_its_emptydirs(helm_bin):
    objects = render(helm_bin, None, "worker.containerEnv[0].name=RAY_TMPDIR",
                     "worker.containerEnv[0].value=/scratch")
    assert chart_check.writable_path_errors(objects) == [
        ("RayCluster mmpipe cpu: Ray's session dir /scratch/ray is not the ray-logs emptyDir "
         "at /tmp/ray (set RAY_TMPDIR=/tmp next to TMPDIR)")]
    objects = render(helm_bin)
    (cluster,) = [o for o in objects if o["kind"] == "RayCluster"]
    ray = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ray["volumeMounts"] = [m for m in ray["volumeMounts"]
                           if m["mountPath"] != "/home/ray/.cache"]
    assert chart_check.writable_path_errors(objects) == [
        ("RayCluster mmpipe head: read-only root filesystem and no writable emptyDir at "
         "/home/ray/.cache")]
