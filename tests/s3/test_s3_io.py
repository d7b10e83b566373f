"""The storage layer against a real S3 API (SeaweedFS over HTTP on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.storage import fs, retry
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore, CommitMarker
from pipeline.read import committed_files
from pipeline.output.gc import unreferenced_files
from pipeline.input import make_datasource
from pipeline.assembly import assemble
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from tests.conftest import PHOTOS, upload_dir
from tests.servers import FaultProxy


def test_listing_streams_pages_in_key_order(s3_server, s3_env):
    client = s3_server.client()
    keys = [f"many/{i:05d}.txt" for i in range(2100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=s3_env, Key=k, Body=k.encode()), keys))
    got = [e.uri for e in fs.list_files(f"s3://{s3_env}/many")]
    assert got == [f"s3://{s3_env}/{k}" for k in keys]          # 3 pages of <= 1000
    assert fs.read_bytes(f"s3://{s3_env}/many/00042.txt") == b"many/00042.txt"
    assert list(fs.list_files(f"s3://{s3_env}/nothing-here")) == []


def test_conditional_create_is_exclusive_and_idempotent(s3_env):
    uri = f"s3://{s3_env}/_checkpoints/p-000000.json"
    assert fs.create_exclusive(uri, b"first") is True
    assert fs.create_exclusive(uri, b"second") is False
    assert fs.read_bytes(uri) == b"first"
    store = CheckpointStore(f"s3://{s3_env}")
    marker = CommitMarker(attempt_id="aaa", partition_id="p-000001", fingerprint="f",
                          files=[], rows_in=0, rows_by_status={})
    assert store.commit(marker) is True
    # a retry of our own request after a lost response sees 412 but our own marker: won
    assert store.commit(marker) is True
    assert store.commit(marker.model_copy(update={"attempt_id": "bbb"})) is False


def test_permanent_errors_fail_fast_naming_the_uri(s3_server, s3_env, monkeypatch):
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(f"s3://{s3_env}/missing/key.jpg")
    with pytest.raises(retry.StorageError, match="no-such-bucket-x"):
        list(fs.list_files("s3://no-such-bucket-x/prefix"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    fs.configure()
    with pytest.raises(retry.StorageError, match=f"s3://{s3_env}/a"):
        fs.write_bytes(f"s3://{s3_env}/a", b"x")
    assert retry.POLICY.retried_requests == 0                    # no retries on 403


def test_retries_through_injected_faults(s3_server, s3_env, monkeypatch):
    proxy = FaultProxy(s3_server.port, fault_rate=0.3, seed=3)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
        fs.configure(max_attempts=12)
        # 8 requests at a time: their retry waits overlap (one after another they take ~25 s)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: fs.write_bytes(f"s3://{s3_env}/faulty/{i:03d}",
                                                   str(i).encode()), range(40)))
            assert list(pool.map(lambda i: fs.read_bytes(f"s3://{s3_env}/faulty/{i:03d}"),
                                 range(40))) == [str(i).encode() for i in range(40)]
        assert len(list(fs.list_files(f"s3://{s3_env}/faulty"))) == 40
        assert proxy.counts["slowdown"] > 0 and proxy.counts["reset"] > 0
        # every SlowDown is counted, except those the AWS SDK absorbs inside a multipart
        # upload (CompleteMultipartUpload is retried by pyarrow itself)
        slowdowns = proxy.counts["slowdown"]
        assert slowdowns // 2 <= retry.POLICY.throttled_requests <= slowdowns
        assert retry.POLICY.retried_requests >= retry.POLICY.throttled_requests + 1
    finally:
        proxy.stop()


def test_aimd_limiter_halves_on_throttle_and_regrows():
    lim = retry.AimdLimiter(16)
    lim.on_throttle()
    lim.on_throttle()
    assert lim.limit == 4
    for _ in range(30):
        lim.on_success()
    assert 8 < lim.limit <= 16


def _spec(src: str, out: str, **runtime) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": src, "partition_size": 10},
        "sink": {"uri": out}, "text_embedding": {"enabled": False}, "runtime": runtime})


def test_commit_race_and_zombie_attempt_on_s3(s3_server, s3_env, mixed_input, capsys):
    upload_dir(s3_server.client(), s3_env, "in", mixed_input)
    out = f"s3://{s3_env}/out"
    spec = _spec(f"s3://{s3_env}/in", out, batch_size=3)
    pool = ThreadPoolExecutor(2)
    winner_pipeline, zombie_pipeline = (assemble(spec, executor=pool, setup=True)
                                        for _ in range(2))
    source = winner_pipeline.datasource
    plan, how = planning.load_or_create(out, spec.source, source.list_inputs)
    assert how == "new" and len(plan) == 2
    part = planning.read_partition(out, plan.partition_ids[0])
    assert part.inputs[0].uri.startswith(f"s3://{s3_env}/in/")

    class Paused:
        """A datasource that stops a zombie attempt mid-partition until released."""

        def __init__(self):
            self.reached, self.release = threading.Event(), threading.Event()

        def __getattr__(self, name):
            return getattr(source, name)

        def read_partition(self, partition, batch_size, pool, stats=None):
            for i, batch in enumerate(source.read_partition(partition, batch_size, pool, stats)):
                if i == 1:
                    self.reached.set()
                    self.release.wait(60)
                yield batch

    paused = zombie_pipeline.datasource = Paused()
    zombie_result = {}
    zombie = threading.Thread(target=lambda: zombie_result.update(
        outcome=run_partition(zombie_pipeline, part, "zombie", pool)))
    zombie.start()
    assert paused.reached.wait(60)
    winner = run_partition(winner_pipeline, part, "winner", pool)
    assert winner.committed
    paused.release.set()
    zombie.join(60)
    assert zombie_result["outcome"].committed is False
    marker = CheckpointStore(out).markers()[part.partition_id]
    assert marker.attempt_id == "winner"
    files = [e.uri for e in fs.list_files(f"{out}/data")]
    assert files and all("/a-winner/" in f for f in files)       # nothing of the zombie
    assert not any("a-zombie" in e.uri for e in fs.list_files(f"{out}/quarantine"))
    table = pq.read_table(committed_files(out)[0].removeprefix("s3://"), filesystem=fs.s3.filesystem())
    assert table.num_rows == marker.rows_in == 10
    # a failed attempt's leftovers are garbage: gc lists and deletes exactly those
    stray = f"{out}/data/{part.partition_id}/a-crashed/part-00000.parquet"
    fs.write_bytes(stray, b"partial")
    assert unreferenced_files(out) == [stray]
    assert cli.main(["gc", out, "--dry-run", "--min-age-s", "0"]) == 0
    assert fs.exists(stray)
    # --min-age-s still spares young files if asked; by default the lease decides: the
    # crashed attempt holds none, so its file goes
    assert unreferenced_files(out, min_age_s=3600) == []
    assert cli.main(["gc", out, "--min-age-s", "3600"]) == 0 and fs.exists(stray)
    assert cli.main(["gc", out]) == 0 and not fs.exists(stray)
    assert unreferenced_files(out) == []
    capsys.readouterr()
    assert cli.main(["status", out, "--json"]) == 3          # a partition pending
    status = json.loads(capsys.readouterr().out)
    assert (status["partitions_planned"], status["partitions_committed"],
            status["partitions_pending"]) == (2, 1, 1)


def test_videos_from_s3_are_staged_one_batch_at_a_time_and_deleted(s3_server, s3_env, tmp_path):
    """media: video from s3:// - each video is streamed to a temporary file in
    video.temp_dir for its batch, decoded from there, and deleted when the next batch is
    requested; at most one batch of videos is on disk."""
    from pipeline.columns import SOURCE_PATH
    from pipeline.media.video import decode_video

    client = s3_server.client()
    names = ["chaplin.mp4", "nasa_13013.mp4", "big_buck_bunny_432_433.webm"]
    for name in names:
        client.upload_file(str(PHOTOS.parent / "videos" / name), s3_env, f"videos/{name}")
    temp = tmp_path / "stage"
    temp.mkdir()
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "media": "video", "uri": f"s3://{s3_env}/videos"},
        "sink": {"uri": str(tmp_path / "out")}, "video": {"temp_dir": str(temp)}})
    src = make_datasource(spec.source, spec.decode, spec.download, spec.video)
    part = next(planning.pack(src.list_inputs(), 10))
    seen = []
    with ThreadPoolExecutor(2) as pool:
        for batch in src.read_partition(part, 2, pool):
            staged = sorted(temp.iterdir())
            assert len(staged) == len(batch["key"])             # this batch only
            for key, path in zip(batch["key"], batch[SOURCE_PATH]):
                assert path.startswith(str(temp))
                info = decode_video(path, spec.video)
                local = decode_video(str(PHOTOS.parent / "videos" / next(
                    n for n in names if n.startswith(key))), spec.video)
                assert (info.frame_count, info.timestamps_s) == (local.frame_count,
                                                                 local.timestamps_s)
                seen.append(key)
            assert batch["_source_bytes"] == [None] * len(batch["key"])
    assert sorted(seen) == sorted(n.rsplit(".", 1)[0] for n in names)
    assert list(temp.iterdir()) == []                           # all deleted
