"""WebDataset output member names are safe to extract (issue 12): keys come from the
input, and a key such as ``/etc/passwd`` made an absolute tar member name."""

from __future__ import annotations

import json
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.output.sinks.webdataset import safe_member_key
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from tests.conftest import REPO

KEYS = ["/etc/passwd", "../../escape", "a/../../../b", "..", "C:\\..\\win", "nul\x00byte"]


def test_hostile_keys_become_relative_member_names(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    rows = [json.loads(line) for line in (REPO / "data/photos/captions.jsonl").open()]
    with (src / "m.jsonl").open("w") as f:
        for key, row in zip(KEYS, rows):
            shutil.copy(REPO / "data/photos" / row["file"], src / row["file"])
            f.write(json.dumps({"key": key, "file": row["file"]}) + "\n")
    spec = JobSpec.model_validate({
        "source": {"kind": "manifest", "uri": str(src / "m.jsonl"), "path_column": "file",
                   "key_column": "key", "partition_size": 10},
        "sink": {"uri": str(tmp_path / "out"), "webdataset": {"enabled": True}},
        "text_embedding": {"enabled": False}, "dedup": {"exact": False, "near": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, None, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), spec.source.partition_size))
    out = run_partition(pipeline, part, "beef", pool)
    pool.shutdown()
    assert out.committed and out.marker.rows_by_status["ok"] == len(KEYS)
    shards = [f for f in out.marker.files if f.startswith("wds/")]
    names, originals = [], set()
    for shard in shards:
        with tarfile.open(tmp_path / "out" / shard) as tar:
            for member in tar:
                names.append(member.name)
                if member.name.endswith(".json"):
                    originals.add(json.load(tar.extractfile(member))["key"])
    assert len(originals) == len(KEYS)                        # one sample per row
    assert {"/etc/passwd", "../../escape"} <= originals       # the JSON keeps the input key
    for name in names:
        assert not name.startswith("/") and ".." not in name.split("/"), name
        assert "\\" not in name and "\x00" not in name, name
    assert safe_member_key("/etc/passwd") == "etc/passwd"
    assert safe_member_key("..") == "_" and safe_member_key("dir/k.1") == "dir/k.1"
