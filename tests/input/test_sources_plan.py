"""Datasources (files + sidecars, Parquet/CSV/JSONL manifests) and the partition plan."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipeline.errors import PlanError
from pipeline.output import plan as planning
from pipeline.input import make_datasource
from pipeline.spec import DecodeSpec, SourceSpec
from tests.conftest import PHOTOS, coco_captions

POOL = ThreadPoolExecutor(2)


def read_errors(batch) -> list:
    """The datasource's typed read errors as the ``error`` column's text."""
    return [None if e is None else str(e) for e in batch["_read_error"]]


def test_files_datasource_lists_media_and_sidecars(mixed_input):
    spec = SourceSpec(kind="files", uri=str(mixed_input), partition_size=5)
    src = make_datasource(spec, DecodeSpec())
    items = list(src.list_inputs())
    assert len(items) == 19                     # 12 photos + 1 copy + 6 case files
    assert [i.uri for i in items] == sorted(i.uri for i in items)
    assert sum(i.caption_uri is not None for i in items) == 12
    parts = list(planning.pack(items, spec.partition_size))
    assert [len(p.inputs) for p in parts] == [5, 5, 5, 4]
    assert [p.partition_id for p in parts] == ["p-000000", "p-000001", "p-000002", "p-000003"]
    batches = list(src.read_partition(parts[0], 3, POOL))
    assert [len(b["key"]) for b in batches] == [3, 2]
    by_key = {r["key"]: (i, r) for i, r in enumerate(coco_captions()[:12])}
    for batch in batches:
        for j, key in enumerate(batch["key"]):
            i, row = by_key[key]
            assert batch["_source_bytes"][j] == (PHOTOS / row["file"]).read_bytes()
            if i % 2:   # .txt sidecar: raw bytes, decoded by the caption step
                assert batch["_raw_caption"][j] == row["captions"][0].encode()
                assert batch["metadata_json"][j] is None
            else:       # .json sidecar: caption key, the rest as metadata_json
                assert batch["_raw_caption"][j] == row["captions"][0]
                assert json.loads(batch["metadata_json"][j]) == {"license": row["license"]}


def test_files_datasource_empty_prefix_fails_planning(tmp_path):
    src = make_datasource(SourceSpec(kind="files", uri=str(tmp_path)), DecodeSpec())
    with pytest.raises(PlanError, match="no files"):
        list(src.list_inputs())


def test_oversized_file_becomes_error_without_reading(mixed_input):
    spec = SourceSpec(kind="files", uri=str(mixed_input), partition_size=100)
    src = make_datasource(spec, DecodeSpec(max_bytes=1000))
    part = next(planning.pack(src.list_inputs(), spec.partition_size))
    batch = next(src.read_partition(part, 100, POOL))
    big = [i for i, e in enumerate(read_errors(batch)) if e and e.startswith("too_large")]
    assert len(big) >= 13 and all(batch["_source_bytes"][i] is None for i in big)


def _manifest_rows(n: int) -> list[dict]:
    return [{"path": str(PHOTOS / r["file"]), "caption": r["captions"][1], "key": r["key"],
             "width": r["width"], "license": r["license"]} for r in coco_captions()[:n]]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_manifest_formats_carry_columns(tmp_path, fmt):
    rows = _manifest_rows(7)
    table = pa.Table.from_pylist(rows)
    path = tmp_path / f"m.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        path.write_text("\n".join(json.dumps(r) for r in rows))
    spec = SourceSpec(kind="manifest", uri=str(path), key_column="key", partition_size=3,
                      allowed_roots=(str(PHOTOS),))  # the manifest names the photos
    src = make_datasource(spec, DecodeSpec())
    parts = list(planning.pack(src.list_inputs(), spec.partition_size))
    assert [p.rows_planned for p in parts] == [3, 3, 1]
    fields = {f.name for f in src.extra_fields(parts[1])}
    assert fields == {"meta_width", "license"}   # `width` is reserved: carried as meta_width
    batch = next(src.read_partition(parts[1], 10, POOL))
    assert batch["key"] == [r["key"] for r in rows[3:6]]
    assert batch["_raw_caption"] == [r["caption"] for r in rows[3:6]]
    assert batch["meta_width"] == [r["width"] for r in rows[3:6]]
    assert batch["_source_bytes"][0] == (PHOTOS / coco_captions()[3]["file"]).read_bytes()


def test_manifest_missing_media_is_a_row_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"url": "missing.jpg", "caption": "x"}) + "\n"
                    + json.dumps({"url": None, "caption": "y"}) + "\n")
    spec = SourceSpec(kind="manifest", uri=str(path))
    src = make_datasource(spec, DecodeSpec())
    part = next(planning.pack(src.list_inputs(), spec.partition_size))
    batch = next(src.read_partition(part, 10, POOL))
    assert read_errors(batch)[0].startswith("input_missing:") and "missing.jpg" in read_errors(batch)[0]
    assert read_errors(batch)[1].startswith("read_failed:")


def test_plan_is_written_once_and_reused_with_listing_change_warning(mixed_input, tmp_path, caplog):
    spec = SourceSpec(kind="files", uri=str(mixed_input), partition_size=4)
    src = make_datasource(spec, DecodeSpec())
    out = str(tmp_path / "out")
    plan1, how1 = planning.load_or_create(out, spec, src.list_inputs)
    assert how1 == "new" and len(plan1) == 5
    assert plan1.partition_ids == tuple(f"p-{i:06d}" for i in range(5))
    assert plan1.rows_planned == (4, 4, 4, 4, 3)
    parts = list(planning.pack(src.list_inputs(), 4))
    for part in parts:
        assert planning.read_partition(out, part.partition_id) == part
    plan2, how2 = planning.load_or_create(out, spec, src.list_inputs)
    assert how2 == "stored" and plan2 == plan1
    (mixed_input / "late_arrival.jpg").write_bytes((PHOTOS / coco_captions()[20]["file"]).read_bytes())
    with caplog.at_level(logging.WARNING):
        plan3, how3 = planning.load_or_create(out, spec, src.list_inputs)
    assert how3 == "stored, input listing changed" and plan3 == plan1
    assert "input listing has changed" in caplog.text
    other = SourceSpec(kind="files", uri=str(mixed_input), partition_size=3)
    with pytest.raises(PlanError, match="another source spec"):
        planning.load_or_create(out, other, src.list_inputs)


def test_corrupt_manifests_are_planned_as_one_error_row_naming_the_file(tmp_path):
    """T11 (a Parquet file cut at 60%: no footer) and T12 (a plain-text URL list named
    .parquet) do not stop planning and do not vanish: each is one planned record, read as
    one error row naming the file; the good manifest beside them plans and reads."""
    import shutil

    from tests.conftest import CASES

    shutil.copy(CASES / "T11_shard/laion_sample_1000_truncated.parquet", tmp_path / "a_t11.parquet")
    pq.write_table(pa.Table.from_pylist(_manifest_rows(5)), tmp_path / "b_good.parquet")
    shutil.copy(CASES / "T12_shard/url_list_named.parquet", tmp_path / "c_t12.parquet")
    spec = SourceSpec(kind="manifest", uri=str(tmp_path), key_column="key", partition_size=3,
                      allowed_roots=(str(PHOTOS),))
    src = make_datasource(spec, DecodeSpec())
    parts = list(planning.pack(src.list_inputs(), spec.partition_size))
    assert [[(i.uri.rsplit("/", 1)[1], i.row_start, i.row_stop) for i in p.inputs]
            for p in parts] == [[("a_t11.parquet", 0, 1)], [("b_good.parquet", 0, 3)],
                                [("b_good.parquet", 3, 5), ("c_t12.parquet", 0, 1)]]
    assert [p.rows_planned for p in parts] == [1, 3, 3]
    first = next(src.read_partition(parts[0], 10, POOL))
    assert first["key"] == ["a_t11#manifest"] and first["_source_bytes"] == [None]
    assert read_errors(first)[0].startswith("read_failed: manifest ")
    assert "a_t11.parquet: cannot read as parquet" in read_errors(first)[0]
    last = list(src.read_partition(parts[2], 10, POOL))
    assert [b["key"] for b in last] == [[r["key"] for r in _manifest_rows(5)[3:]],
                                        ["c_t12#manifest"]]
    assert not any(read_errors(last[0])) and "c_t12.parquet" in read_errors(last[1])[0]


def test_manifest_enforces_max_bytes_after_reading(tmp_path):
    rows = _manifest_rows(2)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    small = min((PHOTOS / r["file"]).stat().st_size for r in coco_captions()[:2])
    spec = SourceSpec(kind="manifest", uri=str(tmp_path / "m.parquet"), key_column="key",
                      allowed_roots=(str(PHOTOS),))
    src = make_datasource(spec, DecodeSpec(max_bytes=small - 1))
    batch = next(src.read_partition(next(planning.pack(src.list_inputs(), 10)), 10, POOL))
    assert all(e.startswith("too_large: ") for e in read_errors(batch))
    assert batch["_source_bytes"] == [None, None]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_manifest_row_ranges_read_only_what_they_need(tmp_path, fmt):
    """A range spanning Parquet row groups (or CSV/JSONL blocks) gives exactly its rows."""
    from pipeline.input import manifest_rows as manifest

    rows = [{"path": f"p{i}.jpg", "caption": f"c{i}", "key": f"{i:06d}"} for i in range(50)]
    path = tmp_path / f"m.{fmt}"
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=7)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        path.write_text("\n".join(json.dumps(r) for r in rows))
    assert manifest.profile(str(path), "auto", ("key",)).rows == 50
    for start, stop in ((0, 7), (5, 16), (13, 14), (44, 50)):
        got = [k for b in manifest.read_rows(str(path), "auto", start, stop, ("key",), {}, 4)
               for k in b.values["key"]]
        assert got == [r["key"] for r in rows[start:stop]]
    if fmt == "parquet":  # the footer says which row groups a range needs
        assert pq.ParquetFile(path).metadata.num_row_groups == 8


def test_webdataset_video_samples_are_staged_per_batch_and_deleted(tmp_path):
    """Videos inside WebDataset shards: each sample's mp4 member is written to a temporary
    file for its batch (decodable there) and deleted when the next batch is read."""
    import io
    import os
    import tarfile

    from pipeline.columns import SOURCE_PATH
    from pipeline.spec import VideoSpec
    from pipeline.media.video import decode_video
    from tests.conftest import DATA

    shard = tmp_path / "shards" / "v-000000.tar"
    shard.parent.mkdir()
    names = ["chaplin.mp4", "nasa_13013.mp4", "big_buck_bunny_432_433.webm"]
    with tarfile.open(shard, "w") as tar:
        for name in names:
            key, ext = name.rsplit(".", 1)
            tar.add(DATA / "videos" / name, arcname=f"{key}.{ext}")
            caption = f"caption of {key}".encode()
            info = tarfile.TarInfo(f"{key}.txt")
            info.size = len(caption)
            tar.addfile(info, io.BytesIO(caption))
    stage = tmp_path / "stage"
    stage.mkdir()
    video = VideoSpec(temp_dir=str(stage), num_frames=3)
    spec = SourceSpec(kind="webdataset", media="video", uri=str(shard.parent))
    src = make_datasource(spec, DecodeSpec(), None, video)
    part = next(planning.pack(src.list_inputs(), 1))
    keys = []
    for batch in src.read_partition(part, 2, POOL):
        assert len(os.listdir(stage)) == len(batch["key"])
        for key, path, caption in zip(batch["key"], batch[SOURCE_PATH], batch["_raw_caption"]):
            name = next(n for n in names if n.startswith(key))
            assert open(path, "rb").read() == (DATA / "videos" / name).read_bytes()
            assert decode_video(path, video).frame_count == decode_video(
                str(DATA / "videos" / name), video).frame_count
            assert caption == f"caption of {key}".encode()
            keys.append(key)
    assert keys == [n.rsplit(".", 1)[0] for n in names] and os.listdir(stage) == []
