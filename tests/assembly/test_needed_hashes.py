"""Hashes only when something needs them (issue 32): the hash step computes sha256 and
pHash only for in-partition dedup, the dataset dedup index, a signal filter on them or
``sink.hash_columns``; ``validate --explain`` names why; the default spec's fingerprint is
the one it had when both were always computed."""

from __future__ import annotations

import hashlib

import yaml

from pipeline.assembly import assemble
from pipeline.input.source_uri import local_path
from pipeline.media.decode import decode_image
from pipeline.media.transform import phash64
from pipeline.read import read_committed
from pipeline.spec import JobSpec
from pipeline.steps.image import HashStep
from tests.assembly.test_assembly import _files_spec, _run_first_partition
from tests.conftest import PHOTOS, REPO
from tests import inproc

NO_DEDUP = {"dedup": {"exact": False, "near": False}}


def _hash_step(spec: JobSpec) -> HashStep | None:
    return next((s for s in assemble(spec).steps if isinstance(s, HashStep)), None)


def test_no_dedup_computes_no_hash_and_writes_no_hash_column(tmp_path):
    spec = _files_spec(tmp_path, **NO_DEDUP)
    assert _hash_step(spec) is None
    _, part, outcome = _run_first_partition(spec)
    assert outcome.committed and outcome.marker.rows_in == len(part.inputs) == 6
    table = read_committed(spec.sink.uri)
    assert table.num_rows == 6
    assert not {"sha256", "phash", "low_detail"} & set(table.column_names)
    assert {"image", "width", "key"} <= set(table.column_names)


def test_each_need_computes_only_its_hash(tmp_path):
    exact = _hash_step(_files_spec(tmp_path, dedup={"exact": True, "near": False}))
    assert exact.writes == ("sha256",) and exact.reasons == {"sha256": "dedup.exact"}
    near = _hash_step(_files_spec(tmp_path, dedup={"exact": False, "near": True}))
    assert near.writes == ("phash", "low_detail") and near.reasons == {"phash": "dedup.near"}
    index = _hash_step(_files_spec(tmp_path, dedup={"exact": False, "near": False,
                                                    "dataset": {"enabled": True}}))
    assert index.reasons == {"sha256": "dedup.dataset.enabled", "phash": "dedup.dataset.near"}
    asked = _hash_step(_files_spec(tmp_path, **NO_DEDUP, sink={
        "uri": str(tmp_path / "o"), "hash_columns": ["phash"]}))
    assert asked.reasons == {"phash": "sink.hash_columns"}
    signal = _hash_step(_files_spec(tmp_path, **NO_DEDUP, filters={"signals": [
        {"column": "phash", "min": 0}]}))
    assert signal.reasons == {"phash": "filters.signals[0]"}


def test_requested_hash_values_are_the_real_ones(tmp_path):
    spec = _files_spec(tmp_path, **NO_DEDUP, sink={"uri": str(tmp_path / "out"),
                                                  "hash_columns": ["sha256", "phash"]})
    _, _, outcome = _run_first_partition(spec)
    assert outcome.committed
    rows = read_committed(spec.sink.uri).to_pylist()
    assert len(rows) == 6
    for row in rows:
        with open(local_path(row["source_uri"]), "rb") as f:
            data = f.read()
        assert row["sha256"] == hashlib.sha256(data).hexdigest()
        pixels = decode_image(data, max_pixels=10**9, draft_min_side_px=224).pixels
        assert row["phash"] == phash64(pixels)
        assert row["low_detail"] is False


def test_default_fingerprint_is_unchanged(tmp_path):
    """Both hashes computed (the default dedup): the hash step's settings are the ``{}``
    every output had before, so existing outputs keep resuming."""
    spec = _files_spec(tmp_path)
    step = _hash_step(spec)
    assert step.settings() == {} and set(step.writes) == {"sha256", "phash", "low_detail"}
    assert assemble(spec).settings()["steps"]["HashStep"] == {}


def _explain(capsys, path) -> str:
    done = inproc.command(capsys, "validate", "--explain", str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_validate_explain_names_why(tmp_path, capsys):
    spec = {"name": "x", "source": {"kind": "files", "uri": str(PHOTOS)},
            "sink": {"uri": str(tmp_path / "out")}, "text_embedding": {"enabled": False},
            "dedup": {"exact": True, "near": False}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = _explain(capsys, path)
    assert "sha256 needed by dedup.exact" in out and "phash:" not in out
    spec["dedup"] = NO_DEDUP["dedup"]
    path.write_text(yaml.safe_dump(spec))
    out = _explain(capsys, path)
    assert "no hash step" in out and "sha256" not in out.split("output columns")[1]
