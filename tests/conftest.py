"""Shared fixtures: paths to the bundled real data, and a local Ray for in-process jobs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
PHOTOS = DATA / "photos"
CASES = DATA / "cases"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Keep every Ray that the tests start (and the subprocesses they run) on 127.0.0.1: on Linux
# Ray otherwise binds its node to the machine's routable address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# An in-process driver (the session's ray_local) prints Ray's autoscaler events, such as
# "(autoscaler +14m) Tip: use `ray status`", to this process's stdout, where tests that read
# their own stdout (capsys) would see them.
os.environ.setdefault("RAY_SCHEDULER_EVENTS", "0")


#: Test files by their measured cost, heaviest first (seconds in one ``make test`` on 2 cores,
#: junit times summed per file; rough order is enough). ``make test`` hands whole files to its
#: two xdist workers in collection order (``--dist loadfile --no-loadscope-reorder``), and
#: ``pytest_collection_modifyitems`` puts these first: a heavy file that started last would run
#: on one worker while the other sat idle (xdist's default order, by number of tests per file,
#: put exactly these few-test, heavy files last). Files not named follow in collection order.
HEAVY_FIRST = (
    "tests/test_readme.py", "tests/e2e/test_admission.py",
    "tests/runtime/test_process_executor.py", "tests/deploy/test_local_head.py",
    "tests/deploy/test_submit.py", "tests/s3/test_storage_outage.py",
    "tests/runtime/test_foreign_ray.py", "tests/s3/test_s3_faults.py",
    "tests/runtime/test_dashboard.py", "tests/e2e/test_output_safety.py",
    "tests/dedup/test_dedup_pass.py", "tests/e2e/test_resume.py",
    "tests/test_quality_example.py", "tests/runtime/test_metrics.py",
    "tests/dedup/test_dedup_edges.py", "tests/chaos/test_attempt_timeout.py",
    "tests/runtime/test_cli_terminal.py", "tests/e2e/test_cases_accounting.py",
    "tests/deploy/test_image_requirements.py", "tests/bench/test_throughput.py",
    "tests/e2e/test_shared_cluster.py", "tests/output/test_delta_table.py",
    "tests/models/test_image_classifier.py", "tests/security/test_local_ray_loopback.py",
    "tests/bench/test_peers.py", "tests/test_plugins.py", "tests/chaos/test_elastic_pool.py",
    "tests/e2e/test_inputs.py", "tests/models/test_device_decode.py",
    "tests/chaos/test_node_loss.py", "tests/models/test_model_job.py",
    "tests/runtime/test_metric_cardinality.py", "tests/chaos/test_poison.py",
    "tests/e2e/test_append.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the ``HEAVY_FIRST`` files first, in that order; every file's tests keep their
    order (a stable sort by file rank)."""
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: rank.get(
        Path(str(item.path)).relative_to(root).as_posix(), len(rank)))


def coco_captions() -> list[dict]:
    """Rows of data/photos/captions.jsonl (57 COCO photos, 5 captions each)."""
    return [json.loads(line) for line in (PHOTOS / "captions.jsonl").read_text().splitlines()]


def start_local_ray():
    """``ray.init`` of a new local Ray (2 CPUs) of this process's own: ``address="local"``,
    so a cluster that ``ray start`` registered on this machine (``ray_current_cluster``) is
    never joined (tests/runtime/test_foreign_ray.py). Returns Ray's context."""
    import ray

    return ray.init(address="local", num_cpus=2, include_dashboard=False,
                    logging_level="WARNING")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray (2 CPUs) shared by in-process job tests; shut down at the end."""
    import ray

    start_local_ray()
    yield ray
    ray.shutdown()


#: A JPEG cut short: C01, cut inside its final EOI marker (``decode._jpeg_missing_eoi``).
TRUNCATED_JPEG = "C01_trunc/truncated_jpeg.jpg"


@pytest.fixture
def mixed_input(tmp_path) -> Path:
    """A files-datasource input: 12 real photos with .txt/.json sidecar captions, a byte
    duplicate of one photo, and 6 broken case files (no sidecars)."""
    src = tmp_path / "input"
    src.mkdir()
    rows = coco_captions()[:12]
    for i, row in enumerate(rows):
        shutil.copy(PHOTOS / row["file"], src / row["file"])
        stem = src / row["file"].rsplit(".", 1)[0]
        if i % 2:
            (stem.with_suffix(".txt")).write_text(row["captions"][0])
        else:
            (stem.with_suffix(".json")).write_text(json.dumps(
                {"caption": row["captions"][0], "license": row["license"]}))
    first = rows[0]["file"].rsplit(".", 1)[0]
    shutil.copy(PHOTOS / rows[0]["file"], src / f"{first}_copy.jpg")  # sorts next to it
    shutil.copy(CASES / TRUNCATED_JPEG, src / "truncated_jpeg.jpg")
    for case in ["C38_zero/empty.jpg",
                 "C41_ext/html_redirect_page.jpg", "C35_bomb/decompression_bomb.gif",
                 "C06_exif/hopper_orientation_6.jpg", "C40_ext/hopper_png_bytes.jpg"]:
        shutil.copy(CASES / case, src / case.split("/")[1])
    return src


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 API: SeaweedFS ``weed mini`` on 127.0.0.1 (stopped at the end)."""
    from tests.servers import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process (and Ray workers it starts) talks to the test S3 server; a fresh bucket."""
    import uuid

    from pipeline.storage import fs

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    fs.configure()
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    yield bucket
    fs.configure()


def upload_dir(client, bucket: str, prefix: str, root: Path) -> int:
    """Upload every file under ``root`` to ``s3://bucket/prefix/...``; return the count."""
    n = 0
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")
            n += 1
    return n
