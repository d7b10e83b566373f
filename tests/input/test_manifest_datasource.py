"""Property (issue 11): manifests with random formats, encodings, types, newlines, nulls and
column sets, several in one job, go through the datasource, the plan and ``run_partition``
to committed Parquet: rows out == rows in, per partition and in total."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.read import read_committed
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from tests.input.test_manifest import _csv_cell, _manifests

POOL = ThreadPoolExecutor(2)


def _write(path: Path, fmt: str, rows: list[dict], kinds: dict, encoding: str) -> None:
    if fmt == "parquet":
        columns = {"path": pa.array([r["path"] for r in rows], pa.string()),
                   "caption": pa.array([None if r["caption"] is None else str(r["caption"])
                                        for r in rows], pa.large_string())}
        for name in kinds:  # one Parquet type per column: text of whatever was drawn
            columns[name] = pa.array([None if r[name] is None else str(r[name]) for r in rows],
                                     pa.string())
        pq.write_table(pa.table(columns), path, row_group_size=3)
        return
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["path", "caption", *kinds])
        for r in rows:
            writer.writerow([_csv_cell(r[k]) for k in ("path", "caption", *kinds)])
        text = out.getvalue()
    else:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    try:
        raw = text.encode(encoding)
    except UnicodeEncodeError:
        raw = text.encode("utf-8")
    path.write_bytes(raw)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_property_manifests_through_the_datasource_rows_out_equal_rows_in(data):
    n_files = data.draw(st.integers(1, 3))
    partition_size = data.draw(st.integers(1, 12))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in", Path(tmp) / "out"
        src.mkdir()
        total = 0
        for f in range(n_files):
            fmt = data.draw(st.sampled_from(["csv", "jsonl", "parquet"]))
            rows, kinds, _, _ = data.draw(_manifests(fmt))
            encoding = data.draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "cp1252"]))
            _write(src / f"m{f}.{fmt}", fmt, rows, kinds, encoding)
            total += len(rows)
        spec = JobSpec.model_validate({
            "source": {"kind": "manifest", "uri": str(src), "partition_size": partition_size},
            "sink": {"uri": str(out)}, "text_embedding": {"enabled": False}})
        pipeline = assemble(spec, executor=POOL, setup=True)
        source = pipeline.datasource
        try:
            plan = planning.write_plan(str(out), source.list_inputs(), spec.source, None,
                                       source.plan_metadata)
        except Exception as e:  # every manifest empty: nothing to plan
            assert total == 0 and "nothing to plan" in str(e)
            return
        assert plan.rows_total == total
        for pid in plan.partition_ids:
            outcome = run_partition(pipeline, planning.read_partition(str(out), pid), "a1", POOL)
            assert outcome.committed and outcome.marker.rows_in == outcome.marker.rows_planned
        markers = CheckpointStore(str(out)).markers()
        assert sum(m.rows_in for m in markers.values()) == total
        table = read_committed(str(out))
        assert table.num_rows == total and len(set(table.column("key").to_pylist())) == total
        for caption in table.column("caption").to_pylist():
            assert caption is None or "\x00" not in caption
