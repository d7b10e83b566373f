"""examples/images.yaml: an image folder (data/photos) with `.txt`/`.json` caption sidecars,
read by the files datasource; and a `.json` sidecar without the configured caption key."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.read import read_committed
from pipeline.input import make_datasource
from pipeline.runtime.partition import run_partition
from pipeline.spec import load_spec
from pipeline.steps.caption import CaptionStep
from tests.conftest import PHOTOS, REPO, coco_captions

IMAGES = REPO / "examples" / "images.yaml"


def test_sidecars_are_derived_from_the_coco_captions():
    """Sorted by file name: even positions have `<stem>.txt` (the first caption), odd ones
    `<stem>.json` (all five captions, the COCO id and the licence); nothing else."""
    rows = sorted(coco_captions(), key=lambda r: r["file"])
    for i, row in enumerate(rows):
        stem = PHOTOS / row["file"].rsplit(".", 1)[0]
        txt, side = stem.with_suffix(".txt"), stem.with_suffix(".json")
        assert txt.exists() != side.exists() and txt.exists() == (i % 2 == 0), stem
        if i % 2 == 0:
            assert txt.read_text(encoding="utf-8") == row["captions"][0] + "\n"
        else:
            assert json.loads(side.read_text(encoding="utf-8")) == {
                "caption": row["captions"], "coco_id": int(row["key"]), "license": row["license"],
                "license_url": row["license_url"], "flickr_url": row["flickr_url"]}
    assert len(list(PHOTOS.glob("*.txt"))) == 29 and len(list(PHOTOS.glob("*.json"))) == 28


def test_example_finds_every_caption(tmp_path):
    """The example spec, run in this process (no Ray, no model): 57 rows in 4 partitions,
    all ok, each with its sidecar's caption; the `.json` keys beside the caption go to
    metadata_json; the manifest beside the photos is counted as not read."""
    spec = load_spec(IMAGES, ["text_embedding.enabled=false"], output_uri=str(tmp_path / "out"))
    assert spec.source.kind == "files" and spec.source.caption_column == "caption"
    with ThreadPoolExecutor(2) as pool:
        pipeline = assemble(spec, executor=pool, setup=True)
        source = pipeline.datasource
        plan = planning.write_plan(spec.sink.uri, source.list_inputs(), spec.source,
                                   source.items_per_partition, source.plan_metadata)
        assert len(plan.partition_ids) == 4
        assert json.loads(source.plan_metadata()["unread_by_extension"]) == {".jsonl": 1}
        for pid in plan.partition_ids:
            assert run_partition(pipeline, planning.read_partition(spec.sink.uri, pid), "a1",
                                 pool).committed
    rows = {r["key"]: r for r in read_committed(spec.sink.uri).to_pylist()}
    want = {r["key"]: r for r in coco_captions()}
    assert sorted(rows) == sorted(want)
    for key, row in rows.items():
        assert row["status"] == "ok" and row["caption"] == want[key]["captions"][0], key
        from_json = (PHOTOS / f"{key}.json").exists()
        assert row["caption_flags"] == (["from_list"] if from_json else []), key
        meta = json.loads(row["metadata_json"]) if from_json else row["metadata_json"]
        assert meta == ({"coco_id": int(key), "license": want[key]["license"],
                         "license_url": want[key]["license_url"],
                         "flickr_url": want[key]["flickr_url"]} if from_json else None), key


def test_a_json_sidecar_without_the_configured_key_is_flagged(tmp_path):
    """The trial of issue 16: `caption_column: captions` (the quickstart manifest's column)
    on the photo folder. `.txt` sidecars still give their caption; a `.json` sidecar that
    has no `captions` key gives no caption, flagged `caption_key_missing` (not only
    `missing_caption`), with its keys, `caption` included, in metadata_json."""
    spec = load_spec(IMAGES, ["source.caption_column=captions", "source.partition_size=100"])
    source = make_datasource(spec.source, spec.decode)
    (partition,) = planning.pack(source.list_inputs(), source.items_per_partition)
    step = CaptionStep(spec.captions)
    with ThreadPoolExecutor(2) as pool:
        batches = [step(b) for b in source.read_partition(partition, 64, pool)]
    rows = [dict(zip(b, values)) for b in batches for values in zip(*b.values())]
    assert len(rows) == 57
    for row in rows:
        if (PHOTOS / f"{row['key']}.json").exists():
            assert row["caption"] is None, row["key"]
            assert row["caption_flags"] == ["caption_key_missing", "missing_caption"]
            assert len(json.loads(row["metadata_json"])["caption"]) == 5
        else:
            assert row["caption"] and row["caption_flags"] == [], row["key"]


def test_a_webdataset_json_member_without_the_configured_key_is_flagged_alike(tmp_path):
    """The same reading for WebDataset samples: `json` without `caption_column` (and no
    `txt`) -> no caption, `caption_key_missing`; with the key -> its caption."""
    import io
    import tarfile

    from pipeline.spec import DecodeSpec, SourceSpec

    jpg = (PHOTOS / "000000000790.jpg").read_bytes()
    shard = tmp_path / "shard-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.jpg", jpg), ("a.json", b'{"caption": "c", "id": 1}'),
                           ("b.jpg", jpg), ("b.json", b'{"text": "t", "id": 2}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = make_datasource(SourceSpec(kind="webdataset", uri=str(shard), caption_column="text"),
                             DecodeSpec())
    (partition,) = planning.pack(source.list_inputs(), source.items_per_partition)
    with ThreadPoolExecutor(1) as pool:
        (batch,) = [CaptionStep(load_spec(IMAGES).captions)(b)
                    for b in source.read_partition(partition, 8, pool)]
    assert batch["key"] == ["a", "b"] and batch["caption"] == [None, "t"]
    assert batch["caption_flags"] == [["caption_key_missing", "missing_caption"], []]
    assert [json.loads(m) for m in batch["metadata_json"]] == [{"caption": "c", "id": 1},
                                                               {"id": 2}]


def test_a_copy_in_another_partition_is_caught_by_the_dataset_pass(ray_local, tmp_path,
                                                                     capsys):
    """The example on a folder of one's own (`--input DIR`): a byte copy of a photo that
    sorts into another partition is no in-partition duplicate (every row `ok`); the
    dataset-wide pass the example turns on finds it, and the deduplicated view leaves it
    out. ``mmpipe run`` in this process on the session's Ray (``tests/inproc.py``; the
    local Ray the pass starts from a shell is tests/runtime's and test_readme's)."""
    from pipeline.dedup.store import latest_duplicates
    from pipeline.read import read_output
    from tests import inproc

    folder = tmp_path / "photos"
    folder.mkdir()
    photos = sorted(PHOTOS.glob("*.jpg"))[:8]
    for photo in photos:
        (folder / photo.name).write_bytes(photo.read_bytes())
    (folder / "zz_copy.jpg").write_bytes(photos[0].read_bytes())   # last: partition 3 of 3
    out = tmp_path / "out"
    run = inproc.mmpipe(capsys, "run", str(IMAGES), "--input", str(folder), "--output",
                        str(out), "--set", "source.partition_size=4",
                        "--set", "text_embedding.enabled=false")
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "partitions: 3 total, 3 committed now" in run.stdout
    assert "rows: ok=9 rejected=0 error=0" in run.stdout      # no partition holds both
    assert "duplicates: 1 (exact 1)" in run.stdout, run.stdout
    dups = latest_duplicates(str(out)).to_pylist()
    assert [(d["key"], d["duplicate_of"], d["kind"]) for d in dups] == [
        ("zz_copy", photos[0].stem, "exact")]
    view = read_output(str(out), ["key"], deduplicated=True).to_table()
    assert sorted(view["key"].to_pylist()) == sorted(p.stem for p in photos)
