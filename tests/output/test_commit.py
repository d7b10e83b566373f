"""The commit protocol without Ray: two attempts of one partition, exactly one visible."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq

from pipeline import cli
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import committed_files
from pipeline.assembly import assemble
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec


def test_second_attempt_loses_the_race_and_deletes_its_files(mixed_input, tmp_path, capsys):
    out = tmp_path / "out"
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(mixed_input), "partition_size": 10},
        "sink": {"uri": str(out)}, "text_embedding": {"enabled": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create(str(out), spec.source, pipeline.datasource.list_inputs)
    part = planning.read_partition(str(out), plan.partition_ids[0])
    fp = pipeline.fingerprint
    first = run_partition(pipeline, part, "aaaa", pool)
    second = run_partition(pipeline, part, "bbbb", pool)
    assert first.committed and not second.committed
    marker = CheckpointStore(str(out)).markers()[part.partition_id]
    assert marker.attempt_id == "aaaa" and marker.fingerprint == fp
    assert not (out / "data" / part.partition_id / "a-bbbb").exists()
    assert not (out / "quarantine" / part.partition_id / "a-bbbb").exists()
    files = committed_files(str(out))
    assert len(files) == 1 and "a-aaaa" in files[0]
    assert pq.read_table(files[0]).num_rows == marker.rows_in == len(part.inputs)
    for rel, digest in marker.sha256.items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest
    assert cli.main(["status", str(out), "--json"]) == 3      # a partition pending
    status = json.loads(capsys.readouterr().out)
    assert status["partitions_planned"] == 2 and status["partitions_committed"] == 1
    assert status["partitions_pending"] == 1 and status["partitions_failed"] == {}
    assert (status["job"], status["fingerprint"], status["complete"]) == ("mmpipe-job", fp, False)
    assert sum(status["rows_by_status"].values()) == len(part.inputs)


def test_gc_on_a_relative_output_path_deletes_only_unreferenced_files(
        mixed_input, tmp_path, monkeypatch, capsys):
    """`mmpipe gc output/x` (relative, as in every README example) must compare the
    markers' files with the listing in one form: only the stray attempt's file goes."""
    from pipeline.output.gc import unreferenced_files

    monkeypatch.chdir(tmp_path)
    spec = JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(mixed_input), "partition_size": 10},
        "sink": {"uri": "output/x", "webdataset": {"enabled": True}},
        "text_embedding": {"enabled": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create("output/x", spec.source, pipeline.datasource.list_inputs)
    part = planning.read_partition("output/x", plan.partition_ids[0])
    out = run_partition(pipeline, part, "aaaa", pool)
    assert out.committed and any(f.startswith("wds/") for f in out.marker.files)
    stray = tmp_path / "output/x/data" / part.partition_id / "a-dead" / "part-00000.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"partial")
    assert unreferenced_files("output/x") == [str(stray)]
    assert [f.rsplit("/a-", 1)[1] for f in committed_files("output/x")] == ["aaaa/part-00000.parquet"]
    capsys.readouterr()
    # by liveness: the stray attempt holds no lease, so it is garbage whatever its age
    assert cli.main(["gc", "output/x", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"would delete {stray}", "1 unreferenced files (dry run)"]
    assert stray.exists()
    assert cli.main(["gc", "output/x"]) == 0
    assert not stray.exists()
    for rel in out.marker.files:
        assert (tmp_path / "output/x" / rel).exists(), rel
    capsys.readouterr()
