"""Output you can read anywhere (issue 16, point 7), without Ray: every caption, pHash as
int64, ``source_uri`` as a URI, Parquet key-value metadata, ``mmpipe ls``, ``read_output``."""

from __future__ import annotations

import importlib.metadata
import io
import json
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor

import imagehash
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline import cli, read_output
from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import committed_files, read_committed
from pipeline.input.source_uri import SourceUris, local_path
from pipeline.input import make_datasource
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec, load_spec
from pipeline.steps.caption import CaptionStep
from pipeline.media.decode import decode_image
from tests.conftest import PHOTOS, REPO, coco_captions

ROWS = {r["key"]: r for r in coco_captions()}


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart spec as the README runs it (relative ``source.uri``, from the repo
    root) with WebDataset output and no model: 2 partitions of 3 records committed in this
    process; then an attempt no marker names and ``.tar`` files beside the Parquet files."""
    out = tmp_path_factory.mktemp("quickstart") / "out"
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    try:
        spec = load_spec(str(REPO / "examples/quickstart.yaml"), [
            "source.partition_size=3", "text_embedding.enabled=false",
            "sink.webdataset.enabled=true", "runtime.batch_size=3"], None, str(out))
        pool = ThreadPoolExecutor(2)
        pipeline = assemble(spec, executor=pool, setup=True)
        source = pipeline.datasource
        items = list(source.list_inputs())[:2]          # two row ranges of 3 records
        plan = planning.write_plan(str(out), iter(items), spec.source, None,
                                   source.plan_metadata)
        for n, pid in enumerate(plan.partition_ids):
            run_partition(pipeline, planning.read_partition(str(out), pid), f"att{n}", pool)
    finally:
        mp.undo()
    data = committed_files(str(out))
    stray = out / "data" / "p-000001" / "a-notcommitted" / "part-00000.parquet"
    stray.parent.mkdir(parents=True)
    shutil.copy(data[0], stray)
    shard = committed_files(str(out), "wds")[0]
    shutil.copy(shard, out / "beside.tar")
    shutil.copy(shard, out / "data" / "beside.tar")
    return spec, pipeline, out


def test_every_caption_phash_int64_and_relative_source_uri(quickstart):
    spec, pipeline, out = quickstart
    table = read_committed(str(out))
    assert table.num_rows == 6
    assert table.schema.field("captions").type == pa.list_(pa.large_string())
    assert table.schema.field("phash").type == pa.int64()
    for row in table.to_pylist():
        want = ROWS[row["key"]]
        assert len(row["captions"]) == 5 and row["captions"] == want["captions"]
        assert row["caption"] == want["captions"][0] and row["caption_flags"] == ["from_list"]
        # relative to the working directory the job was started from, as source.uri was
        assert row["source_uri"] == f"data/photos/{want['file']}"
        assert open(local_path(row["source_uri"], str(REPO)), "rb").read() == (
            PHOTOS / want["file"]).read_bytes()
        # the same 64 bits as imagehash's hex string, read as two's complement
        pixels = decode_image((PHOTOS / want["file"]).read_bytes(),
                              draft_min_side_px=spec.resize.size_px).pixels
        unsigned = int(str(imagehash.phash(Image.fromarray(pixels))), 16)
        assert row["phash"] == np.array([unsigned], np.uint64).view(np.int64)[0]
    # the WebDataset JSON member carries the same source_uri and every caption
    shard = committed_files(str(out), "wds")[0]
    with tarfile.open(shard) as tar:
        metas = [json.loads(tar.extractfile(m).read()) for m in tar if m.name.endswith(".json")]
    assert metas and all(m["source_uri"].startswith("data/photos/") and len(m["captions"]) == 5
                         for m in metas)


def test_parquet_files_carry_version_fingerprint_spec_partition_attempt(quickstart):
    spec, pipeline, out = quickstart
    markers = CheckpointStore(str(out)).markers()
    assert len(markers) == 2
    for pid, marker in markers.items():
        data = [f for f in marker.files if f.startswith("data/")]
        assert len(data) == 1
        kv = {k.decode(): v.decode() for k, v in pq.read_metadata(out / data[0]).metadata.items()}
        assert "ARROW:schema" in kv                       # pyarrow's own, kept
        assert kv["mmpipe.version"] == importlib.metadata.version("mmpipe")
        assert kv["mmpipe.fingerprint"] == marker.fingerprint == pipeline.fingerprint
        assert (kv["mmpipe.partition_id"], kv["mmpipe.attempt_id"]) == (pid, marker.attempt_id)
        assert JobSpec.model_validate_json(kv["mmpipe.spec"]) == spec
        assert json.loads(kv["mmpipe.spec"])["sink"]["uri"] == str(out)


def test_mmpipe_ls_prints_committed_files_only(quickstart, tmp_path, capsys):
    _, _, out = quickstart
    markers = CheckpointStore(str(out)).markers()
    named = [str(out / f) for _, m in sorted(markers.items()) for f in m.files]
    assert cli.main(["ls", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == named
    assert cli.main(["ls", str(out), "--kind", "data"]) == 0
    data = capsys.readouterr().out.splitlines()
    assert len(data) == 2 and all(f.endswith("/part-00000.parquet") and "/data/p-" in f
                                  for f in data)
    assert not any("notcommitted" in f or f.endswith("beside.tar") for f in named)
    assert cli.main(["ls", str(out), "--kind", "wds"]) == 0
    wds = capsys.readouterr().out.splitlines()
    assert wds and all("/wds/p-" in f and f.endswith(".tar") for f in wds)
    assert cli.main(["ls", str(out), "--kind", "quarantine"]) == 0   # no error rows
    assert capsys.readouterr().out == ""
    for not_output in (tmp_path, tmp_path / "missing", out / "data"):
        assert cli.main(["ls", str(not_output)]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: {not_output} is not an mmpipe output "
                       "(no _plan/ or _checkpoints/)\n")


def test_read_output_reads_committed_parquet_only(quickstart, tmp_path):
    _, pipeline, out = quickstart
    with pytest.raises(pa.ArrowInvalid):     # what a naive read of the directory meets
        ds.dataset(str(out / "data"), format="parquet").to_table()
    dataset = read_output(str(out))
    assert isinstance(dataset, ds.Dataset)
    assert dataset.files == committed_files(str(out))     # local: the same absolute paths
    table = dataset.to_table()
    assert table.num_rows == 6 and sorted(table.column("key").to_pylist()) == sorted(
        read_committed(str(out)).column("key").to_pylist())
    meta = dataset.schema.metadata
    assert meta[b"mmpipe.fingerprint"].decode() == pipeline.fingerprint
    assert b"mmpipe.partition_id" not in meta             # per file, not per dataset
    frame = table.to_pandas()                             # pandas
    assert frame.shape == (6, len(dataset.schema)) and frame["phash"].dtype == np.int64
    assert [len(c) for c in frame["captions"]] == [5] * 6
    some = read_output(str(out), columns=["key", "captions"])
    assert some.schema.names == ["key", "captions"] and some.to_table().num_rows == 6
    with pytest.raises(ValueError, match="nope"):
        read_output(str(out), columns=["key", "nope"])
    empty = read_output(str(out), kind="quarantine")        # no error rows: empty, typed
    assert empty.files == [] and empty.to_table().num_rows == 0
    assert empty.schema.names == dataset.schema.names + ["source_bytes", "source_sha256",
                                                         "source_size"]
    with pytest.raises(ValueError, match="'wds'"):
        read_output(str(out), kind="wds")
    with pytest.raises(FileNotFoundError, match="not an mmpipe output"):
        read_output(str(tmp_path))


def test_list_captions_in_json_sidecars_and_webdataset_members(tmp_path):
    photos = coco_captions()[:3]
    src = tmp_path / "files"
    src.mkdir()
    for r in photos[:2]:
        shutil.copy(PHOTOS / r["file"], src / r["file"])
    stem = [r["file"][:-4] for r in photos]
    (src / f"{stem[0]}.json").write_text(json.dumps({"caption": ["", *photos[0]["captions"]],
                                                     "license": "x"}))
    (src / f"{stem[1]}.txt").write_text(" one caption \n")
    shards = tmp_path / "shards"
    shards.mkdir()
    with tarfile.open(shards / "s-000000.tar", "w") as tar:
        for name, blob in ((f"{stem[2]}.jpg", (PHOTOS / photos[2]["file"]).read_bytes()),
                           (f"{stem[2]}.json", json.dumps({"caption": photos[2]["captions"]})
                            .encode())):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    got = {}
    for kind, root in (("files", src), ("webdataset", shards)):
        spec = JobSpec.model_validate({"source": {"kind": kind, "uri": str(root)},
                                       "sink": {"uri": str(tmp_path / "out")},
                                       "text_embedding": {"enabled": False}})
        source = make_datasource(spec.source, spec.decode)
        part = next(planning.pack(source.list_inputs(), 10))
        for batch in source.read_partition(part, 8, ThreadPoolExecutor(2)):
            batch = CaptionStep(spec.captions)(batch)
            got.update({k: (u, c) for k, u, c in zip(batch["key"], batch["source_uri"],
                                                       batch["captions"])})
    assert got == {
        stem[0]: ((src / photos[0]["file"]).as_uri(), photos[0]["captions"]),
        stem[1]: ((src / photos[1]["file"]).as_uri(), ["one caption"]),
        stem[2]: (f"{(shards / 's-000000.tar').as_uri()}#{stem[2]}.jpg", photos[2]["captions"])}


def test_source_uri_forms():
    rel = SourceUris("data/in/m.jsonl", "/w/main/data/in/m.jsonl")
    assert rel("/w/main/data/in/a b#1.jpg") == "data/in/a%20b%231.jpg"
    assert rel("/w/main/other/x.jpg") == "other/x.jpg"          # still under the working dir
    assert rel("/elsewhere/x.jpg") == "file:///elsewhere/x.jpg"
    assert SourceUris("../in", "/w/in")("/w/in/sub/x.jpg") == "../in/sub/x.jpg"
    assert SourceUris(".", "/w/main")("/w/main/x.jpg") == "x.jpg"
    absolute = SourceUris("/w/in")
    assert absolute("/w/in/caf\udce9.jpg") == "file:///w/in/caf%E9.jpg"   # not UTF-8
    assert local_path(absolute("/w/in/caf\udce9.jpg")) == b"/w/in/caf\xe9.jpg"
    assert absolute("file:///w/in/x.jpg") == "file:///w/in/x.jpg"
    s3 = SourceUris("s3://b/in")
    assert s3("s3://b/in/a b.jpg") == "s3://b/in/a b.jpg" and s3("S3://b/k") == "s3://b/k"
    assert s3("https://h.example/a.jpg?x=1") == "https://h.example/a.jpg?x=1"
    assert s3("data:image/png;base64," + "A" * 100).endswith("... (122 characters)")
    wds = SourceUris("sh", "/w/sh", ["/w/sh/a#1.tar", "s3://b/c.tar"])
    assert wds("/w/sh/a#1.tar#k/x#y.jpg") == "sh/a%231.tar#k/x#y.jpg"
    shards = SourceUris("s3://b", None, ["s3://b/c.tar"])
    assert shards("s3://b/c.tar#k.jpg") == "s3://b/c.tar#k.jpg"
    with pytest.raises(ValueError):
        local_path("s3://b/k.jpg")
