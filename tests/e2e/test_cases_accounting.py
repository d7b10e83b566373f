"""Issue 11 end to end on a real local Ray: the handed N cases (data/README.md) run as
jobs; every job reports its input totals, every committed partition reconciles with its
plan, and each case's rows, values and flags are the expected ones."""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec
from tests.conftest import CASES
from tests.e2e.jobs import check_accounting, rows_by_key


def _run(src: Path, out: Path, **over):
    data = {"name": "cases", "source": {"kind": "files", "uri": str(src)},
            "sink": {"uri": str(out)},
            "runtime": {"batch_size": 64, "num_workers": 1, "max_attempts": 2},
            "text_embedding": {"enabled": False}}
    for section, values in over.items():
        data.setdefault(section, {}).update(values)
    report = run_job(JobSpec.model_validate(data))
    assert report.complete, report.format()
    check_accounting(str(out), planned=data["source"].get("kind") != "webdataset")
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["rows_out"] == report.rows_out and success["inputs"] == report.inputs
    return report, rows_by_key(str(out))


def test_n01_every_row_of_a_csv_with_quoted_newlines(ray_local, tmp_path):
    """16,264 rows in, 16,264 rows out; the captions keep their newlines. (Every row names
    the same photo: the claim is the manifest's rows, so dedup, whose hashes were half the
    run's CPU, is off.)"""
    src = CASES / "N01_csv_newline_captions/manifest/yfcc_like.csv"
    with open(src, newline="", encoding="utf-8") as f:
        want = {r["key"]: r["caption"] for r in csv.DictReader(f)}
    assert len(want) == 16_264
    report, rows = _run(src, tmp_path / "out", source={
        "kind": "manifest", "key_column": "key", "partition_size": 6000},
        dedup={"exact": False, "near": False})
    assert report.inputs["rows"] == report.rows_out == 16_264 and report.partitions_total == 3
    assert len(rows) == 16_264 and {k: r["caption"] for k, r in rows.items()} == want
    assert rows["000007"]["caption"] == "A photo number 7\nsecond line of caption 7"
    assert all(r["status"] != "error" for r in rows.values())


def test_n03_n04_manifest_types_and_encodings(ray_local, tmp_path):
    """N03: a numeric caption becomes text with a flag; a carried id that is a string and
    then a number is text. N04: a Windows-1252 CSV decodes with the fallback and a flag.
    Keys repeated across two manifests stay unique."""
    # (both manifests name the same three images: dedup off, so every row stays ok; keys
    # are made unique within a partition (pipeline.keys), so both stay in one partition)
    report, rows = _run(CASES / "N03_jsonl_mixed_types", tmp_path / "n03", source={
        "kind": "manifest", "key_column": "key", "partition_size": 1000},
        dedup={"exact": False, "near": False})
    assert report.rows_out == report.inputs["rows"] == 6 and report.inputs["warnings"] == []
    assert sorted(rows) == ["r0", "r0%2A1", "r1", "r1%2A1", "r2", "r2%2A1"]
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows["r1"]["caption"] == "1984" and "non_string_caption" in rows["r1"]["caption_flags"]
    assert [rows[k]["source_id"] for k in ("r0%2A1", "r1%2A1", "r2%2A1")] == ["a-17", "4711", "b-3"]
    assert rows["r0"]["source_id"] is None

    report, rows = _run(CASES / "N04_csv_cp1252/manifest/excel_export.csv", tmp_path / "n04",
                        source={"kind": "manifest", "key_column": "key"})
    assert {k: (r["status"], r["caption"], r["caption_flags"]) for k, r in rows.items()} == {
        "r0": ("ok", "\u201cCaf\u00e9 terrace\u201d at night \u2013 Arles", ["encoding_fixed"]),
        "r1": ("ok", "plain ascii caption", []),
        "r2": ("ok", "Stra\u00dfe in M\u00fcnchen\u2019s old town", ["encoding_fixed"])}


def test_n05_lone_surrogates_and_n12_float_tiffs(ray_local, tmp_path):
    """N05: the cut emoji becomes U+FFFD with a flag, in a sidecar and in a shard; the
    other samples are unaffected. N12: float TIFFs are scaled, flagged, not black."""
    _, rows = _run(CASES / "N05_json_lone_surrogate/files", tmp_path / "files")
    assert rows["a"]["caption"] == "sunset at the beach \ufffd"
    assert "lone_surrogate" in rows["a"]["caption_flags"]
    assert json.loads(rows["a"]["metadata_json"]) == {"source": "tw"}
    assert rows["b"]["caption"] == "a dog on the grass" and rows["b"]["caption_flags"] == []
    assert {r["status"] for r in rows.values()} == {"ok"}
    _, rows = _run(CASES / "N05_json_lone_surrogate/wds", tmp_path / "wds",
                   source={"kind": "webdataset"})
    assert rows["000000"]["caption"] == "party time \U0001F389 and \ufffd"
    assert "lone_surrogate" in rows["000000"]["caption_flags"]
    assert rows["000001"]["caption"] == "a quiet street"
    assert {r["status"] for r in rows.values()} == {"ok"}

    # (the two float files hold the same ramp: near-dedup off, so both stay ok)
    _, rows = _run(CASES / "N12_tiff_float32/files", tmp_path / "n12",
                   dedup={"exact": False, "near": False})
    for key in ("float01", "float_0_1000"):
        assert rows[key]["status"] == "ok" and "float_scaled" in rows[key]["decode_flags"]
    assert "minmax_scaled" in rows["float_0_1000"]["decode_flags"]
    assert rows["control"]["status"] == "ok" and rows["control"]["decode_flags"] == []


def _wds_keys(out: Path) -> list[str]:
    keys = []
    for shard in sorted(out.glob("wds/*/*/*.tar")):
        with tarfile.open(shard) as tar:
            keys += [m.name.rsplit(".", 1)[0] for m in tar if m.name.endswith(".json")]
    return keys


def test_n08_keys_are_unique_and_the_same_in_parquet_and_webdataset(ray_local, tmp_path):
    """x.jpg and x.png keep their extension in the key; null keys are derived like
    missing ones; WebDataset samples carry exactly the Parquet keys."""
    out = tmp_path / "files"
    _, rows = _run(CASES / "N08_key_collisions/files", out,
                   sink={"webdataset": {"enabled": True}})
    assert sorted(rows) == ["x%2Ejpg", "x%2Epng", "y"]
    assert rows["x%2Ejpg"]["caption"] == rows["x%2Epng"]["caption"] == "caption of x"
    assert rows["x%2Ejpg"]["format"] == "JPEG" and rows["x%2Epng"]["format"] == "PNG"
    assert sorted(_wds_keys(out)) == sorted(k for k, r in rows.items() if r["status"] == "ok")

    out = tmp_path / "manifest"
    _, rows = _run(CASES / "N08_key_collisions/manifest/null_keys.parquet", out,
                   source={"kind": "manifest", "key_column": "key"},
                   sink={"webdataset": {"enabled": True}})
    assert {k: r["caption"] for k, r in rows.items()} == {
        "k0": "zero", "null_keys/000000001": "one", "null_keys/000000002": "two", "k3": "three"}
    assert sorted(_wds_keys(out)) == sorted(k for k, r in rows.items() if r["status"] == "ok")


def test_n09_gzip_shards_are_read_not_skipped(ray_local, tmp_path):
    """.tar, .tar.gz and .tgz shards in one folder: all 5 samples, 3 inputs, none unread."""
    out = tmp_path / "out"
    report, rows = _run(CASES / "N09_wds_gzip_shards/shards", out,
                        source={"kind": "webdataset"})
    assert report.inputs["inputs"] == 3 and report.inputs["unread"] == 0
    assert report.inputs["rows"] is None and report.rows_out == 5
    assert sorted(rows) == [f"{i:06d}" for i in range(5)]
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert sorted(r["source_uri"].rsplit("/", 1)[1] for r in rows.values()) == [
        "shard-000000.tar#000000.jpg", "shard-000000.tar#000001.jpg",
        "shard-000001.tar.gz#000002.jpg", "shard-000001.tar.gz#000003.jpg",
        "shard-000002.tgz#000004.jpg"]
    assert sum(m.rows_in for m in CheckpointStore(str(out)).markers().values()) == 5
