"""Every input accounted for (issue 11): planned totals, unread objects by extension, keys
unique by rule, and no attempt commits with rows missing."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.assembly import assemble
from pipeline.errors import PartitionError
from pipeline.storage import fs
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.input.files import FilesDatasource
from pipeline.input import make_datasource
from pipeline.keys import PartitionKeys, escape_key, given_key, row_key, stem_key
from pipeline.runtime.partition import run_partition
from pipeline.spec import DecodeSpec, JobSpec, SourceSpec, image_extensions
from tests.conftest import CASES, PHOTOS

POOL = ThreadPoolExecutor(2)
N08 = CASES / "N08_key_collisions"


def test_escape_key_is_injective_and_leaves_plain_keys_alone():
    assert escape_key("000000039769") == "000000039769"
    assert escape_key("photos.v2/cat") == "photos.v2/cat"       # dots only matter last
    assert escape_key("a.b") == "a%2Eb" and escape_key("a%2Eb") == "a%252Eb"
    assert escape_key("caf\udce9") == "caf%E9"                  # fsdecode'd byte 0xE9
    assert escape_key("nul\x00") == "nul%00"
    texts = ["x.jpg", "x%2Ejpg", "x_jpg", "x", "x.jpg.png", "a/b.c", "a.b/c", "caf\udce9",
             "caf%E9", "café", "k\ud83c"]
    assert len({escape_key(t) for t in texts}) == len(texts)
    assert stem_key("d/x.jpg") == "d/x" and stem_key("d/x.jpg", keep_extension=True) == "d/x%2Ejpg"
    assert row_key("laion.part1", 7) == "laion%2Epart1/000000007"
    assert given_key(None) is None and given_key("  ") is None and given_key(4711) == "4711"


def test_partition_keys_suffix_repeats_deterministically():
    keys = PartitionKeys()
    assert [keys.unique(k) for k in ["a", "a", "b", "a", "a%2A1"]] == [
        "a", "a%2A1", "b", "a%2A2", "a%2A1%2A1"]


def test_n08_files_sharing_a_stem_keep_their_extension_in_the_key(tmp_path):
    """N08: x.jpg and x.png (one x.txt caption) must not both be key x."""
    src = make_datasource(SourceSpec(kind="files", uri=str(N08 / "files")), DecodeSpec())
    items = list(src.list_inputs())
    assert [(i.uri.rsplit("/", 1)[1], i.key, i.caption_uri.rsplit("/", 1)[1]) for i in items] == [
        ("x.jpg", "x%2Ejpg", "x.txt"), ("x.png", "x%2Epng", "x.txt"), ("y.jpg", "y", "y.txt")]
    part = next(planning.pack(items, 10))
    batch = next(src.read_partition(part, 10, POOL))
    assert batch["key"] == ["x%2Ejpg", "x%2Epng", "y"]
    assert batch["_raw_caption"] == [b"caption of x", b"caption of x", b"caption of y"]
    assert batch["_source_bytes"][1] == (N08 / "files/x.png").read_bytes()


def test_unread_objects_are_counted_by_extension_and_stored_in_the_plan(tmp_path):
    """An .avifs (a format Pillow opens) is read; an unknown extension and an orphan
    sidecar are counted, not silently dropped."""
    out = str(tmp_path / "out")
    tmp_path = tmp_path / "in"
    tmp_path.mkdir()
    for name in ("000000000790.jpg", "000000062554.jpg"):
        shutil.copy(PHOTOS / name, tmp_path / name)
    shutil.copy(CASES / "C45_heic/hopper.avif", tmp_path / "anim.avifs")
    (tmp_path / "notes.xyz").write_text("x")
    (tmp_path / "README").write_text("x")
    (tmp_path / "orphan.txt").write_text("a caption without media")
    assert ".avifs" in image_extensions() and ".heic" in image_extensions()
    spec = SourceSpec(kind="files", uri=str(tmp_path), partition_size=2)
    src = make_datasource(spec, DecodeSpec())
    plan = planning.write_plan(out, src.list_inputs(), spec, None, src.plan_metadata)
    assert plan.totals() == {"inputs": 3, "rows": 3, "unread": 3, "warnings": [], "extensions": [],
                             "unread_by_extension": {"": 1, ".txt (unpaired sidecar)": 1, ".xyz": 1}}
    stored = planning.read_plan(out)
    assert stored.totals() == plan.totals() and stored.rows_planned == (2, 1)
    part = planning.read_partition(out, "p-000001")
    assert part.inputs[0].uri.endswith("anim.avifs") and part.inputs[0].key == "anim"
    assert json.loads(part.plan_metadata["unread_by_extension"]) == {"": 1, ".txt (unpaired sidecar)": 1, ".xyz": 1}


def test_a_manifest_is_one_input_object_however_many_partitions_it_fills(tmp_path):
    """The quickstart manifest (57 rows) in partitions of 15: 1 object, 57 records, 4 partitions."""
    spec = SourceSpec(kind="manifest", uri=str(PHOTOS / "captions.jsonl"), path_column="file",
                      caption_column="captions", partition_size=15)
    src = make_datasource(spec, DecodeSpec())
    plan = planning.write_plan(str(tmp_path), src.list_inputs(), spec,
                               src.items_per_partition, src.plan_metadata)
    assert (plan.totals()["inputs"], plan.totals()["rows"]) == (1, 57)
    assert plan.rows_planned == (15, 15, 15, 12)
    assert planning.read_plan(str(tmp_path)).totals()["inputs"] == 1


class _DroppingDatasource(FilesDatasource):
    """A broken datasource: loses the last record of every batch."""

    def _read(self, partition, batch_size, pool, fetcher):
        for batch in super()._read(partition, batch_size, pool, fetcher):
            yield {k: v[:-1] for k, v in batch.items()}


def test_an_attempt_with_rows_missing_never_commits(tmp_path):
    """The accounting invariant: 3 planned, 2 read -> PartitionError, no marker, no files."""
    for name in ("000000000790.jpg", "000000062554.jpg", "000000000802.jpg"):
        shutil.copy(PHOTOS / name, tmp_path / name)
    out = tmp_path / "out"
    spec = JobSpec.model_validate({"source": {"kind": "files", "uri": str(tmp_path)},
                                   "sink": {"uri": str(out)}, "text_embedding": {"enabled": False}})
    pipeline = assemble(spec, executor=POOL, setup=True)
    good = pipeline.datasource
    pipeline.datasource = _DroppingDatasource(spec.source, spec.decode)
    part = next(planning.pack(good.list_inputs(), 10))
    with pytest.raises(PartitionError, match=r"3 inputs planned, 2 read \(2 counted, 0 with no row\), 2 rows made, 2 written"):
        run_partition(pipeline, part, "dead", POOL)
    assert CheckpointStore(str(out)).markers() == {}
    assert [f.uri for f in fs.list_files(str(out))] == []
    pipeline.datasource = good
    outcome = run_partition(pipeline, part, "beef", POOL)
    assert outcome.committed and outcome.marker.rows_in == outcome.marker.rows_planned == 3
