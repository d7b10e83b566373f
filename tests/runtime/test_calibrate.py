"""Issue 26 item 8: ``mmpipe calibrate`` and ``pipeline.calibration``.

The curves are checked against a brute-force loop over thresholds written here (numpy,
not scikit-learn); the end-to-end tests run a real job on the bundled photos, calibrate
``width``/``height`` through the CLI, and read the result back (JSON, PNG, status)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from pipeline import calibration, cli
from pipeline.calibration import CalibrationError
from pipeline.output import generations, layout
from pipeline.read import read_committed
from pipeline.storage import fs
from tests.conftest import PHOTOS, upload_dir
from tests.input.local_job import run_job

MANIFEST = {"kind": "manifest", "uri": str(PHOTOS / "captions.jsonl"), "path_column": "file",
            "caption_column": "captions", "key_column": "key", "partition_size": 20}


def brute_force(scores, labels) -> dict[str, np.ndarray]:
    """Precision, recall, F1 at every distinct score t (positive iff score >= t), by
    counting: the independent reference for the curves."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    ts = np.unique(scores)
    p, r, f = [], [], []
    for t in ts:
        pred = scores >= t
        tp = int(np.sum(pred & labels))
        fp = int(np.sum(pred & ~labels))
        prec, rec = tp / (tp + fp), tp / int(labels.sum())
        p.append(prec)
        r.append(rec)
        f.append(0.0 if prec + rec == 0 else 2 * prec * rec / (prec + rec))
    return {"thresholds": ts, "precision": np.array(p), "recall": np.array(r),
            "f1": np.array(f)}


def smallest_reaching(ref, precision: float) -> float | None:
    """The smallest threshold whose precision is >= ``precision`` (a plain loop)."""
    for t, p in zip(ref["thresholds"], ref["precision"]):
        if p >= precision:
            return float(t)
    return None


def _labels(rows: list[tuple[str, str, bool]], uri: str = "mem.csv") -> calibration.Labels:
    text = "key,signal,label\n" + "".join(f"{k},{s},{str(v).lower()}\n" for k, s, v in rows)
    return calibration.parse_labels(text.encode(), uri)


@pytest.fixture
def sample():
    """400 labelled rows: positives' scores ~ N(0.65, 0.15), negatives' ~ N(0.4, 0.15),
    rounded to 2 decimals (ties), the highest score a negative (precision 1 is then
    unreachable); plus rows the labels do not name."""
    rng = np.random.default_rng(26)
    truth = rng.random(400) < 0.4
    scores = np.round(np.where(truth, rng.normal(0.65, 0.15, 400),
                               rng.normal(0.4, 0.15, 400)), 2)
    top = int(np.argmax(scores))
    truth[top] = False
    keys = [f"k{i:04d}" for i in range(400)]
    table = pa.table({"key": keys + ["extra1", "extra2"],
                      "score_x": pa.array(list(scores) + [0.5, 0.9], pa.float32())})
    return keys, scores.astype(np.float32).astype(np.float64), truth, table


def test_curves_equal_a_brute_force_count_and_threshold_for_returns_them(sample, tmp_path):
    keys, scores, truth, table = sample
    labels = _labels(list(zip(keys, ["score_x"] * 400, truth)))
    doc = calibration.calibrate(table, labels, ["score_x"], 0.8, "t", {"uri": "x"})
    got, ref = doc["signals"]["score_x"], brute_force(scores, truth)
    assert got["counts"] == {"labelled": 400, "used": 400, "positives": int(truth.sum()),
                             "negatives": int((~truth).sum()), "missing_keys": 0,
                             "ambiguous_keys": 0, "null_scores": 0}
    curve = {k: np.array(v) for k, v in got["curve"].items()}
    assert len(ref["thresholds"]) > 50                      # ties: fewer than 400 points
    np.testing.assert_array_equal(curve["thresholds"], ref["thresholds"])
    np.testing.assert_allclose(curve["precision"], ref["precision"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(curve["recall"], ref["recall"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(curve["f1"], ref["f1"], rtol=0, atol=1e-12)
    best = int(np.argmax(ref["f1"]))
    assert got["best_f1"]["threshold"] == ref["thresholds"][best]
    assert got["best_f1"]["f1"] == pytest.approx(ref["f1"][best], abs=1e-12)
    t80 = smallest_reaching(ref, 0.8)
    i80 = list(ref["thresholds"]).index(t80)
    assert got["at_target"]["threshold"] == t80
    assert got["at_target"]["recall"] == pytest.approx(ref["recall"][i80], abs=1e-12)
    # the highest recall at that precision: no threshold reaching 0.8 recalls more
    assert ref["recall"][i80] == max(r for r, p in zip(ref["recall"], ref["precision"])
                                     if p >= 0.8)

    table_text = calibration.format_table(doc)
    assert f"{ref['f1'][best]:.3f}" in table_text and f"{t80:.6g}" in table_text
    where = calibration.write(str(tmp_path / "out"), doc)
    assert where == str(tmp_path / "out" / "_calibration" / "t" / "calibration.json")
    for p in (0.5, 0.8, 0.9, 0.92):
        expected = smallest_reaching(ref, p)
        assert expected is not None
        assert calibration.threshold_for(where, "score_x", p) == expected
    # the directory holding the file names it too
    assert calibration.threshold_for(str(tmp_path / "out/_calibration/t"), "score_x",
                                     0.8) == t80
    assert ref["precision"].max() < 0.93
    with pytest.raises(CalibrationError, match=r"precision 0.95 is not reachable") as e:
        calibration.threshold_for(where, "score_x", 0.95)
    assert where in str(e.value) and "'score_x'" in str(e.value)
    with pytest.raises(ValueError, match=r"no column 'nsfw_score'.*\['score_x'\]"):
        calibration.threshold_for(where, "nsfw_score", 0.8)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(CalibrationError, match="must be in"):
            calibration.threshold_for(where, "score_x", bad)
    with pytest.raises(CalibrationError, match="not found"):
        calibration.threshold_for(str(tmp_path / "nothing.json"), "score_x", 0.8)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(CalibrationError, match="not an mmpipe calibration"):
        calibration.threshold_for(str(tmp_path / "bad.json"), "score_x", 0.8)


def test_unreachable_target_is_recorded_not_an_error(sample):
    keys, _, truth, table = sample
    labels = _labels(list(zip(keys, ["score_x"] * 400, truth)))
    doc = calibration.calibrate(table, labels, ["score_x"], 1.0, "t", {})
    assert doc["signals"]["score_x"]["at_target"] is None
    assert "unreachable" in calibration.format_table(doc)


def test_missing_keys_null_scores_and_repeated_keys_are_counted_not_dropped():
    table = pa.table({"key": ["a", "b", "c", "d", "e", "f", "f"],
                      "s": pa.array([0.9, None, float("nan"), 0.2, 0.7, 0.5, 0.6])})
    rows = [("a", "s", True), ("b", "s", True), ("c", "s", False), ("d", "s", False),
            ("e", "s", True), ("f", "s", False), ("zz", "s", True), ("yy", "s", False),
            ("a", "other", True)]
    doc = calibration.calibrate(table, _labels(rows), ["s"], 0.9, "n", {})
    s = doc["signals"]["s"]
    assert s["counts"] == {"labelled": 8, "used": 3, "positives": 2, "negatives": 1,
                           "missing_keys": 2, "ambiguous_keys": 1, "null_scores": 2}
    assert s["unused_keys"] == {"missing": ["zz", "yy"], "ambiguous": ["f"],
                                "null_score": ["b", "c"]}
    ref = brute_force([0.9, 0.2, 0.7], [True, False, True])
    assert s["curve"]["thresholds"] == list(ref["thresholds"])
    assert s["curve"]["precision"] == pytest.approx(list(ref["precision"]), abs=1e-12)
    assert doc["labels"]["other_signal_rows"] == 1
    assert "2/1/2" in calibration.format_table(doc)
    with pytest.raises(CalibrationError, match="no positive"):
        calibration.calibrate(table, _labels([("d", "s", False), ("a", "s", False)]),
                              ["s"], 0.9, "n", {})
    with pytest.raises(CalibrationError, match="not a numeric score"):
        calibration.calibrate(pa.table({"key": ["a"], "s": ["x"]}),
                              _labels([("a", "s", True)]), ["s"], 0.9, "n", {})


@pytest.mark.parametrize("name,text,match", [
    ("l.csv", "key,signal,label\na,s,true\nb,s,maybe\n",
     r"l.csv line 3: field 'label': 'maybe' is not one of"),
    ("l.csv", "key,label\na,true\n", r"l.csv line 1: the header .* no column\(s\) \['signal'\]"),
    ("l.csv", "key,signal,label\na,s,true,extra\n", r"line 2: 4 fields, the header has 3"),
    ("l.csv", "key,signal,label\na,s\n", r"line 2: field 'label' is missing"),
    ("l.csv", "key,signal,label\n,s,1\n", r"line 2: field 'key': '' is not a non-empty"),
    ("l.csv", "key,signal,label\na,s,1\nb,s,0\na,s,0\n",
     r"line 4: key 'a' signal 's' is labelled again \(first on line 2\)"),
    ("l.csv", "key,signal,label\n", r"no label rows"),
    ("l.jsonl", '{"key": "a", "signal": "s", "label": true}\n{"key": "b", "signal"\n',
     r"l.jsonl line 2: not JSON"),
    ("l.jsonl", '{"key": "a", "signal": "s"}\n', r"line 1: field 'label' is missing"),
    ("l.jsonl", '{"key": 7, "signal": "s", "label": 1}\n', r"line 1: field 'key': 7"),
    ("l.jsonl", '[1, 2]\n', r"line 1: a JSON list, not an object"),
    ("l.jsonl", '{"key": "a", "signal": "s", "label": 2}\n', r"field 'label': 2 is not"),
    ("l.txt", "key,signal,label\n", r"extension '.txt': expected .csv or .jsonl"),
])
def test_a_malformed_labels_file_fails_naming_the_line_and_field(name, text, match):
    with pytest.raises(CalibrationError, match=match):
        calibration.parse_labels(text.encode(), name)


def test_label_spellings_and_jsonl():
    csv = calibration.parse_labels(
        b"\xef\xbb\xbfkey,signal,label,note\r\na,s, TRUE ,x\r\nb,s,No,\r\nc,s,1,\r\n", "x.csv")
    assert [(r.key, r.signal, r.label, r.line) for r in csv.rows] == [
        ("a", "s", True, 2), ("b", "s", False, 3), ("c", "s", True, 4)]
    jl = calibration.parse_labels(b'{"key": "a", "signal": "s", "label": false}\n\n'
                                  b'{"key": "b", "signal": "t", "label": "yes"}\n', "x.ndjson")
    assert [(r.key, r.signal, r.label, r.line) for r in jl.rows] == [
        ("a", "s", False, 1), ("b", "t", True, 3)]
    assert jl.signals() == ["s", "t"] and len(jl.sha256) == 64


def test_calibration_files_are_owned_names_no_datasink_or_generation_takes():
    for rel in ("_calibration/lab/calibration.json", "_calibration/lab/calibration.png",
                "_calibration/x.v2/calibration.json.tmp-0a1b"):
        assert layout.owned(rel), rel
    for rel in ("_calibration/lab/notes.txt", "_calibration/calibration.json",
                "_calibration/lab/sub/calibration.json"):
        assert not layout.owned(rel), rel
    assert layout.CALIBRATION_DIR not in layout.root_entries()
    with pytest.raises(ValueError, match="not a free top-level name"):
        layout.register_attempt_root("mine", layout.CALIBRATION_DIR)


def _photo_job(out) -> list[dict]:
    rows, _ = run_job(MANIFEST, out)
    assert len(rows) == 57 and {r["status"] for r in rows} == {"ok"}
    return rows


def _write_labels(path, rows: list[dict]) -> dict[str, list[bool]]:
    """Labels on the photos: ``width`` true = landscape (width > height); ``height`` true
    = at least 480 px tall; one unknown key. Returns the label lists by signal."""
    lines, truth = ["key,signal,label"], {"width": [], "height": []}
    for r in rows:
        lines.append(f"{r['key']},width,{'yes' if r['width'] > r['height'] else 'no'}")
        truth["width"].append(r["width"] > r["height"])
        lines.append(f"{r['key']},height,{'1' if r['height'] >= 480 else '0'}")
        truth["height"].append(r["height"] >= 480)
    lines.append("not-a-key,width,true")
    path.write_text("\n".join(lines) + "\n")
    return truth


def test_calibrate_end_to_end_on_the_photos(tmp_path, capsys):
    out = tmp_path / "out"
    rows = _photo_job(out)
    labels = tmp_path / "photo_labels.csv"
    truth = _write_labels(labels, rows)

    assert cli.main(["calibrate", str(out), "--labels", str(labels),
                     "--target-precision", "0.95"]) == 0
    printed = capsys.readouterr().out
    where = out / "_calibration" / "photo_labels"
    doc = json.loads((where / "calibration.json").read_text())
    assert doc["labels"]["sha256"] == hashlib.sha256(labels.read_bytes()).hexdigest()
    committed = read_committed(str(out))
    assert doc["output"]["generation"] == 1
    assert doc["output"]["fingerprint"] == committed.schema.metadata[
        b"mmpipe.fingerprint"].decode()
    assert doc["target_precision"] == 0.95 and list(doc["signals"]) == ["width", "height"]
    for signal in ("width", "height"):
        ref = brute_force([r[signal] for r in rows], truth[signal])
        s = doc["signals"][signal]
        assert s["curve"]["thresholds"] == list(ref["thresholds"])
        assert s["curve"]["precision"] == pytest.approx(list(ref["precision"]), abs=1e-12)
        assert s["curve"]["recall"] == pytest.approx(list(ref["recall"]), abs=1e-12)
        assert s["curve"]["f1"] == pytest.approx(list(ref["f1"]), abs=1e-12)
        best = int(np.argmax(ref["f1"]))
        assert s["best_f1"]["threshold"] == ref["thresholds"][best]
        assert s["at_target"]["threshold"] == smallest_reaching(ref, 0.95)
        line = next(x for x in printed.splitlines() if x.startswith(signal))
        assert f"{ref['f1'][best]:.3f}" in line
        assert f"{smallest_reaching(ref, 0.95):.6g}" in line
    assert doc["signals"]["width"]["counts"]["missing_keys"] == 1
    assert doc["signals"]["width"]["unused_keys"]["missing"] == ["not-a-key"]
    assert doc["signals"]["height"]["counts"]["used"] == 57
    # the heights: 25 photos at least 480 px tall; >= 480 separates them exactly
    assert doc["signals"]["height"]["best_f1"] == {"threshold": 480.0, "precision": 1.0,
                                                   "recall": 1.0, "f1": 1.0}
    assert calibration.threshold_for(str(where / "calibration.json"), "height", 1.0) == 480.0

    with Image.open(io.BytesIO((where / "calibration.png").read_bytes())) as img:
        img.load()
        assert img.format == "PNG" and img.width >= 600 and img.height >= 500

    assert cli.main(["status", str(out)]) == 0
    status = capsys.readouterr().out
    assert "calibration 'photo_labels' (generation 1, target precision 0.95)" in status
    assert "height: best F1 1.000 at >= 480;" in status
    assert cli.main(["status", str(out), "--json"]) == 0
    cals = json.loads(capsys.readouterr().out)["calibrations"]
    assert [c["name"] for c in cals] == ["photo_labels"]
    assert cals[0]["stale"] is False
    assert cals[0]["signals"]["height"]["threshold_at_target"] == \
        doc["signals"]["height"]["at_target"]["threshold"]

    # --signal and --name: only width, into another calibration
    assert cli.main(["calibrate", str(out), "--labels", str(labels), "--signal", "width",
                     "--name", "w-only", "--target-precision", "0.9"]) == 0
    assert "(57 label rows of other signals" in capsys.readouterr().out
    w = json.loads((out / "_calibration/w-only/calibration.json").read_text())
    assert list(w["signals"]) == ["width"] and w["labels"]["other_signal_rows"] == 57

    # a calibration measured on another generation is marked stale
    w["output"]["generation"] = 7
    (out / "_calibration/w-only/calibration.json").write_text(json.dumps(w))
    assert cli.main(["status", str(out)]) == 0
    assert "calibration 'w-only' (generation 7, STALE" in capsys.readouterr().out

    # a damaged calibration file is a warning of status, not a failure
    (out / "_calibration/broken").mkdir()
    (out / "_calibration/broken/calibration.json").write_text("{cut sh")
    assert cli.main(["status", str(out)]) == 0
    status = capsys.readouterr().out
    assert "warning: unreadable calibration" in status and "broken" in status
    assert "calibration 'photo_labels'" in status

    # gc and the deletion of the generation (what --mode overwrite does to the old one)
    # leave the calibrations alone
    from pipeline.output import gc

    found = gc.collect(str(out))
    assert not [u for u in found.garbage if "_calibration" in u]
    assert not [e for e in layout.owned_files(str(out)) if "_calibration" in e.uri]
    generations.delete_generation(str(out), generations.list_generations(str(out))[0])
    assert not (out / "_checkpoints").exists()
    assert sorted(p.name for p in where.iterdir()) == ["calibration.json", "calibration.png"]


def test_calibrate_usage_errors_exit_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    rows = _photo_job(out)
    bad = tmp_path / "bad.csv"
    bad.write_text(f"key,signal,label\n{rows[0]['key']},width,true\n{rows[1]['key']},width,"
                   "perhaps\n")
    assert cli.main(["calibrate", str(out), "--labels", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line 3: field 'label': 'perhaps'" in err
    not_col = tmp_path / "c.jsonl"
    not_col.write_text(json.dumps({"key": rows[0]["key"], "signal": "no_such_signal",
                                   "label": True}) + "\n")
    assert cli.main(["calibrate", str(out), "--labels", str(not_col)]) == 2
    assert "no column(s) ['no_such_signal']" in capsys.readouterr().err
    assert cli.main(["calibrate", str(out), "--labels", str(not_col),
                     "--target-precision", "0"]) == 2
    assert "must be in (0, 1]" in capsys.readouterr().err
    assert cli.main(["calibrate", str(tmp_path / "nowhere"), "--labels", str(bad)]) == 2
    assert cli.main(["calibrate", str(out), "--labels", str(tmp_path / "missing.csv")]) == 2
    assert "not found" in capsys.readouterr().err
    assert cli.main(["calibrate", str(out), "--labels", str(bad), "--name", "../x"]) == 2
    assert not (out / "_calibration").exists()


def test_calibrate_on_s3(tmp_path, s3_env, s3_server, capsys):
    """An output and a labels file on S3: the calibration is written there, listed by
    status and resolved by threshold_for from its s3:// URI."""
    local = tmp_path / "out"
    rows = _photo_job(local)
    labels = tmp_path / "s3labels.csv"
    truth = _write_labels(labels, rows)
    client = s3_server.client()
    upload_dir(client, s3_env, "job/out", local)
    client.upload_file(str(labels), s3_env, "labels/s3labels.csv")
    out = f"s3://{s3_env}/job/out"
    assert cli.main(["calibrate", out, "--labels", f"s3://{s3_env}/labels/s3labels.csv",
                     "--signal", "height"]) == 0
    capsys.readouterr()
    uri = f"{out}/_calibration/s3labels/calibration.json"
    doc = json.loads(fs.read_bytes(uri))
    ref = brute_force([r["height"] for r in rows], truth["height"])
    assert doc["signals"]["height"]["curve"]["thresholds"] == list(ref["thresholds"])
    assert fs.read_bytes(f"{out}/_calibration/s3labels/calibration.png")[:8] == \
        b"\x89PNG\r\n\x1a\n"
    assert calibration.threshold_for(uri, "height", 0.9) == smallest_reaching(ref, 0.9)
    assert [c["name"] for c in calibration.list_calibrations(out)] == ["s3labels"]
    shutil.rmtree(local)
    assert math.isfinite(calibration.threshold_for(uri, "height", 1.0))
