"""Plan extensions (``runtime.mode: append``): new objects become new partitions after the
stored ones; the stored plan files never change; a resume counts what is not planned."""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.errors import PlanError
from pipeline.input import make_datasource
from pipeline.output import plan as planning
from pipeline.spec import DecodeSpec, SourceSpec
from tests.conftest import PHOTOS, coco_captions


def _plan_bytes(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "_plan").iterdir())}


def test_append_extends_the_plan_append_only(mixed_input, tmp_path, caplog):
    spec = SourceSpec(kind="files", uri=str(mixed_input), partition_size=4)
    src = make_datasource(spec, DecodeSpec())
    out = tmp_path / "out"
    plan, how = planning.load_or_create(str(out), spec, src.list_inputs, append=True)
    assert (how, len(plan), plan.inputs_total) == ("new", 5, 19)
    before = _plan_bytes(out)

    new = [row["file"] for row in coco_captions()[20:26]]      # 6 more photos
    for name in new:
        (mixed_input / name).write_bytes((PHOTOS / name).read_bytes())
    (mixed_input / "empty.jpg").unlink()                      # a planned one gone
    with caplog.at_level(logging.WARNING):
        resumed, how = planning.load_or_create(str(out), spec, src.list_inputs)
    assert how == "stored, input listing changed" and resumed == plan
    assert resumed.totals()["not_planned"] == 6 and resumed.totals()["missing"] == 1
    assert "6 listed objects are not in the plan" in caplog.text and "--mode append" in caplog.text

    grown, how = planning.load_or_create(str(out), spec, src.list_inputs, append=True)
    assert how == "stored, extension 1"
    assert grown.partition_ids == plan.partition_ids + ("p-000005", "p-000006")
    assert grown.rows_planned == plan.rows_planned + (4, 2)
    assert (grown.inputs_total, grown.rows_total) == (25, 25)
    assert grown.totals()["not_planned"] == 0 and grown.totals()["missing"] == 1
    after = _plan_bytes(out)
    assert {k: after[k] for k in before} == before               # append-only
    assert set(after) - set(before) == {"extension-0001.parquet", "extension-0001.json"}
    record = json.loads(after["extension-0001.json"])
    assert (record["objects"], record["rows"], record["partition_ids"]) == (
        6, 6, ["p-000005", "p-000006"])
    assert planning.read_plan(str(out)) == grown
    part = planning.read_partition(str(out), "p-000006")
    assert [i.uri.rsplit("/", 1)[1] for i in part.inputs] == sorted(new)[4:]
    assert planning.read_partition(str(out), "p-000000") == next(
        planning.pack(iter(planning.read_partition(str(out), "p-000000").inputs), 4))

    again, how = planning.load_or_create(str(out), spec, src.list_inputs, append=True)
    assert how == "stored" and again == grown and _plan_bytes(out) == after

    (out / "_plan" / "extension-0001.json").rename(out / "_plan" / "extension-0002.json")
    with pytest.raises(PlanError, match="not numbered"):
        planning.read_plan(str(out))


def test_append_plans_a_new_manifest_file(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    rows = coco_captions()
    (inp / "a.jsonl").write_text("".join(
        json.dumps({"url": str(PHOTOS / r["file"]), "caption": "x"}) + "\n" for r in rows[:5]))
    spec = SourceSpec(kind="manifest", uri=str(inp), partition_size=4)
    src = make_datasource(spec, DecodeSpec())
    out = str(tmp_path / "out")
    plan, _ = planning.load_or_create(out, spec, src.list_inputs, append=True)
    assert plan.rows_planned == (4, 1)
    (inp / "b.jsonl").write_text("".join(
        json.dumps({"url": str(PHOTOS / r["file"]), "caption": "y"}) + "\n" for r in rows[5:8]))
    grown, how = planning.load_or_create(out, spec, src.list_inputs, append=True)
    assert how == "stored, extension 1" and grown.rows_planned == (4, 1, 3)
    assert (grown.inputs_total, grown.rows_total) == (2, 8)
    assert planning.read_partition(out, "p-000002").inputs[0].uri.endswith("b.jsonl")

    # a planned manifest deleted since: its planned rows are input_missing rows
    (inp / "a.jsonl").unlink()
    part = planning.read_partition(out, "p-000000")
    batches = list(src.read_partition(part, 3, ThreadPoolExecutor(2)))
    errors = [str(e) for b in batches for e in b["_read_error"]]
    assert [k for b in batches for k in b["key"]] == [f"a/{i:09d}" for i in range(4)]
    assert len(errors) == 4 and all(e.startswith("input_missing: manifest ") for e in errors)
