"""Issue 5 inputs end to end on a real local Ray: WebDataset shards in and out, corrupt
manifests beside good ones. Each job reconciles ``rows_in == ok + rejected + error`` per
partition and resumes: a lost partition (marker and files deleted) is the only one rerun."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec
from tests.conftest import CASES, DATA, PHOTOS, coco_captions
from tests.e2e.jobs import check_accounting, rows_by_key


def _spec(src: Path, out: Path, **over) -> JobSpec:
    data = {"name": "inputs", "source": {"uri": str(src)},
            "sink": {"uri": str(out), "rows_per_row_group": 4},
            "runtime": {"batch_size": 4, "num_workers": 1, "max_attempts": 2},
            "text_embedding": {"enabled": False}}
    for section, values in over.items():
        data.setdefault(section, {}).update(values)
    return JobSpec.model_validate(data)


def _write_shard(path: Path, rows: list[dict]) -> None:
    with tarfile.open(path, "w") as tar:
        for r in rows:
            key = r["file"].rsplit(".", 1)[0]
            for ext, data in (("jpg", (PHOTOS / r["file"]).read_bytes()),
                              ("json", json.dumps({"caption": r["captions"][0],
                                                   "license": r["license"]}).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _lose(out: Path, pid: str) -> None:
    """Simulate a lost partition: its marker and its files are gone."""
    marker = CheckpointStore(str(out)).marker(pid)
    for rel in marker.files:
        (out / rel).unlink()
    (out / "_checkpoints" / f"{pid}.json").unlink()


def test_webdataset_in_and_out_with_bad_shards_and_resume(ray_local, tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    taken = {"000000062554", "000000099053", "000000126107", "000000160012"}  # T07/T09 keys
    photos = [r for r in coco_captions() if r["key"] not in taken][:10]
    _write_shard(src / "a-000000.tar", photos[:6])
    _write_shard(src / "a-000001.tar", photos[6:])
    shutil.copy(CASES / "T07_dupkey/wds_noncontiguous_keys.tar", src / "b-t07.tar")
    shutil.copy(CASES / "T09_shard/wds_bad_members.tar", src / "c-t09.tar")
    cut = (src / "a-000001.tar").read_bytes()
    (src / "d-truncated.tar").write_bytes(cut[: len(cut) // 2])
    out = tmp_path / "out"
    spec = _spec(src, out, source={"kind": "webdataset", "shards_per_partition": 2},
                 dedup={"exact": False, "near": False},
                 sink={"webdataset": {"enabled": True, "shard_max_samples": 4},
                       "hash_columns": ["sha256"]})
    report = run_job(spec)
    assert report.complete and report.partitions_total == 3      # 5 shards, 2 per partition
    markers = check_accounting(str(out), planned=False)
    rows = rows_by_key(str(out), "source_uri")
    by_key = {v["key"]: v for v in rows.values() if "/a-00000" in v["source_uri"]}
    for r in photos:  # every photo of the two good shards, caption from the json member
        row = by_key[r["file"].rsplit(".", 1)[0]]
        assert (row["status"], row["caption"], row["width"]) == ("ok", r["captions"][0], r["width"])
        assert row["sha256"] == hashlib.sha256((PHOTOS / r["file"]).read_bytes()).hexdigest()
        assert json.loads(row["metadata_json"]) == {"license": r["license"]}
    # T07: both keys are non-contiguous -> one error row each, naming key and shard
    for key in ("000000062554", "000000099053"):
        t07 = [v for v in rows.values() if v["source_uri"].endswith(f"b-t07.tar#{key}")]
        assert len(t07) == 1 and t07[0]["status"] == "error"
        assert t07[0]["error"].startswith(f"bad_sample: key '{key}' in shard ")
        assert "b-t07.tar" in t07[0]["error"] and "not contiguous" in t07[0]["error"]
    # T09: the truncated and the empty jpg are error rows, the good two are ok
    # (two of its keys repeat T07's in the same partition: they get %2A1, pipeline.keys)
    t09 = {v["key"]: v for v in rows.values() if "c-t09.tar#" in v["source_uri"]}
    assert {k: (v["status"], (v["error"] or "").split(":")[0]) for k, v in t09.items()} == {
        "000000062554%2A1": ("ok", ""), "000000099053%2A1": ("error", "truncated"),
        "000000126107": ("error", "empty_file"), "000000160012": ("ok", "")}
    # truncated shard: the samples before the cut are kept + one shard-level error row
    trunc = [v for v in rows.values() if "d-truncated.tar" in v["source_uri"]]
    shard_rows = [v for v in trunc if v["key"] == "d-truncated#shard"]
    assert len(shard_rows) == 1 and shard_rows[0]["error"].startswith("truncated_shard: ")
    kept = [v for v in trunc if v["status"] == "ok"]
    assert 0 < len(kept) < 4 and all(v["key"] in {p["file"][:-4] for p in photos[6:]} for v in kept)
    # WebDataset output: shards named by the markers, readable by the webdataset library
    shards = [out / f for m in markers.values() for f in m.files if f.startswith("wds/")]
    assert shards and all(s.exists() for s in shards)
    samples = list(wds.WebDataset([str(s) for s in sorted(shards)], shardshuffle=False,
                                  empty_check=False))
    ok = [v for v in rows.values() if v["status"] == "ok"]
    assert sorted(s["__key__"] for s in samples) == sorted(v["key"] for v in ok)
    for s in samples:
        meta = json.loads(s["json"])
        row = rows[meta["source_uri"]]
        assert meta["key"] == s["__key__"] and meta["status"] == "ok"
        assert s["jpg"] == row["image"] and s["txt"].decode() == row["caption"]
    for m in markers.values():
        for f in m.files:
            assert hashlib.sha256((out / f).read_bytes()).hexdigest() == m.sha256[f]
    # resume: lose one partition; the rerun runs only it and the output is the same
    attempts = {p: m.attempt_id for p, m in markers.items()}
    _lose(out, "p-000001")
    again = run_job(spec)
    assert again.complete and again.partitions_committed == ["p-000001"]
    after = {p: m.attempt_id for p, m in check_accounting(str(out), planned=False).items()}
    assert after.keys() == attempts.keys() and after["p-000001"] != attempts["p-000001"]
    assert {p: a for p, a in after.items() if p != "p-000001"} == {
        p: a for p, a in attempts.items() if p != "p-000001"}
    again_rows = rows_by_key(str(out), "source_uri")
    assert {k: (v["status"], v["sha256"], v["image"]) for k, v in again_rows.items()} == {
        k: (v["status"], v["sha256"], v["image"]) for k, v in rows.items()}


def test_corrupt_manifests_are_error_rows_and_the_job_completes(ray_local, tmp_path):
    """T11/T12 beside a good manifest: each unreadable manifest is one planned record and
    one error row naming it; nothing is lost, so the job completes."""
    src = tmp_path / "manifests"
    src.mkdir()
    shutil.copy(CASES / "T11_shard/laion_sample_1000_truncated.parquet", src / "a_t11.parquet")
    rows = [{"path": str(PHOTOS / r["file"]), "caption": r["captions"][0], "key": r["key"]}
            for r in coco_captions()[:6]]
    pq.write_table(pa.Table.from_pylist(rows), src / "b_good.parquet")
    shutil.copy(CASES / "T12_shard/url_list_named.parquet", src / "c_t12.parquet")
    out = tmp_path / "out"
    report = run_job(_spec(src, out, source={"kind": "manifest", "key_column": "key",
                                             "partition_size": 3,
                                             "allowed_roots": [str(PHOTOS)]}))
    assert report.complete and report.partitions_total == 4   # [t11] [good 0-3] [good 3-6] [t12]
    assert report.inputs["rows"] == report.rows_out == 8
    check_accounting(str(out))
    got = rows_by_key(str(out))
    assert sorted(got) == sorted([r["key"] for r in rows] + ["a_t11#manifest", "c_t12#manifest"])
    assert all(got[r["key"]]["status"] == "ok" for r in rows)
    for key, name in (("a_t11#manifest", "a_t11.parquet"), ("c_t12#manifest", "c_t12.parquet")):
        assert got[key]["status"] == "error" and got[key]["error_reason"] == "read_failed"
        assert f"{name}: cannot read as parquet" in got[key]["error"]


def test_url_manifest_downloads_with_faults_and_resumes(ray_local, tmp_path):
    """An img2dataset-style Parquet manifest (url, caption) served by a local HTTP server
    that injects 404, 500, flaky 503s, slow responses, truncated bodies, HTML pages and
    X-Robots-Tag opt-outs; every row gets the status its URL deserves."""
    from tests.http_server import FaultHTTPServer

    photos = coco_captions()[:12]
    routes = ["ok", "ok", "status/404", "status/500", "flaky/1", "slow/3", "truncated",
              "html", "robots/noai", "robots/otherbot%3A%20noai", "redirect", "ok"]
    expect = ["ok", "ok", "failed_to_download", "failed_to_download", "ok",
              "failed_to_download", "failed_to_download", "not_an_image", "failed_to_download",
              "ok", "ok", "ok"]
    with FaultHTTPServer() as server:
        urls = [server.url(route, r["file"]) for route, r in zip(routes, photos)]
        table = pa.table({"url": urls, "caption": [r["captions"][0] for r in photos]})
        (tmp_path / "m").mkdir()
        pq.write_table(table, tmp_path / "m" / "urls.parquet")
        out = tmp_path / "out"
        spec = _spec(tmp_path / "m", out, source={"kind": "manifest", "partition_size": 6},
                     download={"timeout_s": 1.0, "retries": 2, "backoff_s": 0.01,
                               "max_per_host": 2, "threads": 4,
                               "allow_networks": ["127.0.0.0/8"]},  # loopback server
                     dedup={"exact": False, "near": False}, sink={"hash_columns": ["sha256"]})
        report = run_job(spec)
        assert report.complete and report.partitions_total == 2
        markers = check_accounting(str(out))
        rows = rows_by_key(str(out))
        assert sorted(rows) == [f"urls/{i:09d}" for i in range(12)]
        for i, (route, want) in enumerate(zip(routes, expect)):
            row = rows[f"urls/{i:09d}"]
            got = row["status"] if row["status"] == "ok" else row["error"].split(":")[0]
            assert got == want, (route, row["error"])
            assert row["source_uri"] == urls[i]
            if want == "ok":
                data = (PHOTOS / photos[i]["file"]).read_bytes()
                assert row["sha256"] == hashlib.sha256(data).hexdigest()
                assert row["caption"] == photos[i]["captions"][0]
        assert "HTTP 404" in rows["urls/000000002"]["error"]
        assert "HTTP 500" in rows["urls/000000003"]["error"]
        assert "timeout" in rows["urls/000000005"]["error"]
        assert "truncated body" in rows["urls/000000006"]["error"]
        assert "X-Robots-Tag: noai" in rows["urls/000000008"]["error"]
        assert server.counts[f"/status/500/{photos[3]['file']}"] == 3        # 1 + 2 retries
        assert server.counts[f"/status/404/{photos[2]['file']}"] == 1        # no retry on 4xx
        assert set(server.user_agents) == {spec.download.user_agent}
        downloads = report.to_dict()["downloads"]   # summed from the markers
        assert sum(m.downloads["fetches"] for m in markers.values()) == downloads["fetches"] == 12
        assert downloads["ok"] == 7                  # 12 - 404, 500, slow, truncated, noai
        assert downloads["requests"] == sum(server.counts.values())
        assert (downloads["failed:http_404"], downloads["failed:http_500"],
                downloads["failed:timeout"], downloads["failed:truncated"],
                downloads["failed:opted_out"]) == (1, 1, 1, 1, 1)
        assert "downloads: 12 URLs, 7 ok" in report.format()
        # resume: lose a partition; only it is downloaded again
        before = dict(server.counts)
        _lose(out, "p-000000")
        again = run_job(spec)
        assert again.complete and again.partitions_committed == ["p-000000"]
        assert {p: m.attempt_id for p, m in check_accounting(str(out)).items()}["p-000001"] == \
            markers["p-000001"].attempt_id
        refetched = {p for p in server.counts if server.counts[p] != before.get(p, 0)}
        assert refetched and all(any(u.endswith(p) for u in urls[:6]) for p in refetched)


def test_video_job_rows_errors_and_resume(ray_local, tmp_path):
    """The bundled videos and every V* case through a job without models: one row per
    video with measured duration/fps/frame count, error rows for the broken containers, a
    partial row for V10; a lost partition is the only one rerun, with the same output."""
    src = tmp_path / "videos"
    src.mkdir()
    for f in (DATA / "videos").iterdir():
        shutil.copy(f, src / f.name)
    for case in ("V01_vfr/var_fps_video.mp4", "V03_vrot/video_rotation_90.mp4",
                 "V04_vrot/video_90.mov", "V06_v0/zero_empty_stsc.mp4",
                 "V08_vcorrupt/result_0byte.webm", "V09_vcorrupt/chunk_out_of_range.mp4",
                 "V10_vcorrupt/corrupted.mp4"):
        shutil.copy(CASES / case, src / case.split("/")[1])
    out = tmp_path / "out"
    spec = _spec(src, out, source={"kind": "files", "media": "video", "partition_size": 4},
                 video={"sampling": "fps", "fps": 2.0}, runtime={"batch_size": 2},
                 dedup={"exact": True, "near": False})
    report = run_job(spec)
    assert report.complete and report.partitions_total == 3
    markers = check_accounting(str(out))
    rows = rows_by_key(str(out))
    assert len(rows) == 10
    want = {  # key: (status, error reason, frame_count, width, height, rotation, partial)
        "big_buck_bunny_432_433": ("ok", None, 24, 1280, 720, 0, False),
        "chaplin": ("ok", None, 241, 640, 360, 0, False),
        "nasa_13013": ("ok", None, 390, 480, 270, 0, False),
        "var_fps_video": ("ok", None, 300, 128, 128, 0, False),
        "video_rotation_90": ("ok", None, 1, 60, 100, 90, False),
        "video_90": ("ok", None, 3, 320, 568, 90, False),
        "corrupted": ("ok", None, 49, 1280, 720, 0, True),
        "zero_empty_stsc": ("error", "no_frames", None, None, None, None, None),
        "result_0byte": ("error", "empty_file", None, None, None, None, None),
        "chunk_out_of_range": ("error", "corrupt_container", None, None, None, None, None)}
    for key, w in want.items():
        r = rows[key]
        reason = r["error"].split(":")[0] if r["error"] else None
        got = (r["status"], reason, r["frame_count"], r["width"], r["height"],
               r["rotation_deg"], r["partial"])
        assert got == w, key
        if r["status"] == "ok":  # fps sampling: one frame per 0.5 s of presentation time
            ts = r["frame_timestamps_s"]
            assert len(ts) == len(r["frames"]) >= 1 and ts == sorted(ts)
            assert len(ts) <= int(r["duration_s"] * 2) + 1
            assert r["image"] == r["frames"][len(r["frames"]) // 2]
            assert r["sha256"] == hashlib.sha256((src / r["source_uri"].rsplit("/", 1)[1])
                                                 .read_bytes()).hexdigest()
    attempts = {p: m.attempt_id for p, m in markers.items()}
    _lose(out, "p-000002")
    again = run_job(spec)
    assert again.complete and again.partitions_committed == ["p-000002"]
    after = {p: m.attempt_id for p, m in check_accounting(str(out)).items()}
    assert {p: a for p, a in after.items() if p != "p-000002"} == {
        p: a for p, a in attempts.items() if p != "p-000002"}
    assert {k: (v["status"], v["frame_timestamps_s"], v["frames"])
            for k, v in rows_by_key(str(out)).items()} == {
        k: (v["status"], v["frame_timestamps_s"], v["frames"]) for k, v in rows.items()}
