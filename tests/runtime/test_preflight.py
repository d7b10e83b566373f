"""Cheap checks before Ray starts (``pipeline/runtime/preflight.py``): ``mmpipe run`` run
as a user does (``.venv/bin/mmpipe``, a subprocess) exits 2 within seconds, naming the
problem, for a missing input, a manifest source on a directory of images, an output
committed under another spec, and a Hugging Face model id that is not in the local cache
(offline: no request is sent, the Hub endpoint points at a closed local port)."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from pipeline.assembly import assemble
from pipeline.errors import PlanError
from pipeline.output import plan as planning
from pipeline.runtime import preflight
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec, load_spec
from tests.conftest import REPO
from tests.deploy.local_head import free_ports
from tests.e2e.jobs import clean_ray_env

MMPIPE = str(Path(sys.executable).with_name("mmpipe"))
# Each refusal takes 1.3-2.7 s on this project's 2-core machine (the imports, measured); the
# bound leaves room for a loaded machine and stays far below Ray's start-up (6-15 s) and the
# Hub client's retries (24 s), either of which would mean the check came too late.
FAST_S = 8


def mmpipe_run(spec: Path, *args: str, home: Path, **env: str) -> tuple[int, str, float]:
    """``mmpipe run SPEC ARGS`` with HOME isolated, no HF_HUB_OFFLINE in its environment
    (``mmpipe run`` sets it) and the Hub's endpoint on a closed local port; returns
    ``(exit code, stderr, seconds)``."""
    (port,) = free_ports(1)
    e = clean_ray_env(HOME=str(home), HF_HOME=str(home / "hf"),
                      HF_ENDPOINT=f"http://127.0.0.1:{port}", **env)
    e.pop("HF_HUB_OFFLINE", None)
    t0 = time.time()
    done = subprocess.run([MMPIPE, "run", str(spec), *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr, time.time() - t0


@pytest.fixture
def spec_file(mixed_input, tmp_path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "pre", "source": {"kind": "files", "uri": str(mixed_input), "partition_size": 10},
        "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False}}))
    return path


def test_missing_input_and_manifest_on_a_media_directory_exit_2_before_ray(
        spec_file, mixed_input, tmp_path):
    code, err, took = mmpipe_run(spec_file, "--input", str(tmp_path / "nope"), home=tmp_path)
    assert code == 2 and took < FAST_S, (code, took, err)
    assert err == f"error: source.uri '{tmp_path / 'nope'}' does not exist\n"
    photos = tmp_path / "photos"                     # images only (no .json sidecars)
    photos.mkdir()
    for jpg in sorted(mixed_input.glob("0*.jpg"))[:3]:
        (photos / jpg.name).write_bytes(jpg.read_bytes())
    code, err, took = mmpipe_run(spec_file, "--input", str(photos), "--set",
                                 "source.kind=manifest", home=tmp_path)
    assert code == 2 and took < FAST_S, (code, took, err)
    assert f"source.uri '{photos}': source.kind is manifest but no manifest files" in err
    assert "use --set source.kind=files" in err
    assert not (tmp_path / "out").exists()                     # nothing was written
    # images with .json caption sidecars are not JSONL manifests (issue 16's first trap)
    with pytest.raises(PlanError, match=r"source.kind is manifest but no manifest files .*"
                       r"use --set source.kind=files"):
        preflight.check_source(load_spec(str(spec_file), ["source.kind=manifest"]))


def test_an_output_of_another_spec_is_refused_before_ray(spec_file, tmp_path):
    spec = load_spec(str(spec_file))
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create(spec.sink.uri, spec.source,
                                      pipeline.datasource.list_inputs)
    part = planning.read_partition(spec.sink.uri, plan.partition_ids[0])
    assert run_partition(pipeline, part, "aaaa", pool).committed
    pool.shutdown()
    code, err, took = mmpipe_run(spec_file, "--set", "resize.size_px=128", home=tmp_path)
    assert code == 2 and took < FAST_S, (code, took, err)
    assert "1 partitions were committed under another spec fingerprint" in err
    assert "settings changed: steps.ResizeStep.size_px: 256 -> 128" in err
    # the same check in process, and the stored plan's source spec, and error-if-exists
    assert preflight.preflight(spec).pipeline.fingerprint == pipeline.fingerprint
    other = load_spec(str(spec_file), ["source.partition_size=5"])
    with pytest.raises(PlanError, match="stored plan was made for another source spec"):
        preflight.preflight(other)
    with pytest.raises(PlanError, match="not empty and runtime.mode is error-if-exists"):
        preflight.preflight(load_spec(str(spec_file), ["runtime.mode=error-if-exists"]))
    preflight.preflight(load_spec(str(spec_file), ["runtime.mode=overwrite",
                                                   "resize.size_px=128"]))


def test_a_hugging_face_id_not_in_the_local_cache_exits_2_naming_how_to_provide_it(
        spec_file, tmp_path):
    model = "openai/clip-vit-base-patch32"
    code, err, took = mmpipe_run(spec_file, "--set", "image_embedding.enabled=true",
                                 "--set", f"image_embedding.model={model}", home=tmp_path)
    assert code == 2 and took < FAST_S, (code, took, err)
    assert err.startswith(f"error: image_embedding.model '{model}': not in the local Hugging "
                          f"Face cache ({tmp_path / 'hf' / 'hub'})")
    assert f"`hf download {model}`" in err and "save_pretrained()" in err
    assert "set image_embedding.model to that path, or to an s3:// prefix" in err
    assert "Traceback" not in err and "Retry" not in err


def test_s3_inputs_are_listed_before_ray(s3_server, s3_env):
    """``source.uri`` on a real S3 API: an empty prefix, and a manifest source on images."""
    client = s3_server.client()
    photo = next(p for p in sorted((REPO / "data" / "photos").glob("*.jpg")))
    client.upload_file(str(photo), s3_env, f"photos/{photo.name}")
    client.upload_file(str(REPO / "data" / "photos" / "captions.jsonl"), s3_env,
                       "manifests/captions.jsonl")

    def check(uri: str, kind: str) -> None:
        preflight.check_source(JobSpec.model_validate(
            {"source": {"kind": kind, "uri": uri}, "sink": {"uri": f"s3://{s3_env}/out"}}))

    with pytest.raises(PlanError, match=f"source.uri 's3://{s3_env}/nothing' holds no files"):
        check(f"s3://{s3_env}/nothing", "manifest")
    with pytest.raises(PlanError, match="no manifest files .* use --set source.kind=files"):
        check(f"s3://{s3_env}/photos", "manifest")
    check(f"s3://{s3_env}/manifests", "manifest")
    check(f"s3://{s3_env}/manifests/captions.jsonl", "manifest")
    check(f"s3://{s3_env}/photos", "files")
