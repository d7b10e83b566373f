"""Threshold calibration of quality signals (``mmpipe calibrate``): labels, curves, files.

A labels file names rows of a job's committed output by ``key``, a ``signal`` (a numeric
column of the output: ``aesthetic_score``, ``nsfw_score``, ``sharpness``, ``width``, ...)
and a ``label``. Direction convention (issue 26; ``filters.signals`` relies on it): a
higher score means more of the property the signal measures; ``label`` true means the
row HAS that property (``nsfw_score`` true = is NSFW, ``aesthetic_score`` true = is
aesthetic, ``sharpness`` true = is sharp); at threshold ``t`` a row is predicted
positive iff ``score >= t``. A filter keeping aesthetic rows uses ``min: t``; one
rejecting NSFW rows uses ``max: t``.

Per signal, precision, recall and F1 at every distinct score (``sklearn.metrics.
precision_recall_curve``), the threshold of the best F1 (ties: the lowest, i.e. the
highest recall) and the smallest threshold whose precision reaches the target (the
highest recall at that precision; ``None``: unreachable).

```
<output>/_calibration/<name>/calibration.json   the curves, counts, labels sha256, generation
<output>/_calibration/<name>/calibration.png    precision / recall / F1 vs threshold per signal
```

``_calibration/`` belongs to the output, not to a generation (``output.layout.
CALIBRATION_DIR``): ``mmpipe gc`` and ``--mode overwrite`` never delete it; each file
records the generation and fingerprint it measured, and ``mmpipe status`` marks those of
another generation or fingerprint ``stale``. Running ``mmpipe calibrate`` again with the
same name replaces that calibration. ``threshold_for`` resolves ``{calibration: URI,
precision: p}`` thresholds of job specs. Reading the committed rows is the CLI's (it
calls ``pipeline.read.read_output``); scikit-learn and matplotlib are imported only
when a curve or a plot is made.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import hashlib
import io
import json
import math
import posixpath
import re
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import MmpipeError
from pipeline.output.layout import CALIBRATION_DIR
from pipeline.storage import fs

CALIBRATION_FILE = "calibration.json"
PLOT_FILE = "calibration.png"
FORMAT = "mmpipe.calibration"
VERSION = 1
DIRECTION = ("higher score = more of the property; label true = the row has it; "
             "predicted positive iff score >= threshold")
#: Label spellings (case-insensitive, stripped) and their value.
LABEL_VALUES = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
#: A calibration's name: one path component, as the output layout's names.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Keys listed in the JSON per signal for each kind of unused label (the counts are full).
SAMPLE_KEYS = 20


class CalibrationError(MmpipeError, ValueError):
    """A labels file, a calibration file or a reference to one is unusable; the message
    names the file, the line or field, and the value. ``mmpipe calibrate`` exits 2."""


@dataclasses.dataclass(frozen=True)
class Label:
    """One row of a labels file: ``key`` of an output row, ``signal`` (a column name),
    ``label`` (True: the row has the property), ``line`` (1-based line in the file)."""

    key: str
    signal: str
    label: bool
    line: int


@dataclasses.dataclass(frozen=True)
class Labels:
    """A parsed labels file: its ``uri``, ``format`` (``csv`` | ``jsonl``), ``sha256`` of
    its bytes (hex) and ``rows`` in file order."""

    uri: str
    format: str
    sha256: str
    rows: list[Label]

    def signals(self) -> list[str]:
        """The signals named, in order of first appearance."""
        return list(dict.fromkeys(r.signal for r in self.rows))

    def keys(self) -> list[str]:
        """The keys named (each once)."""
        return list(dict.fromkeys(r.key for r in self.rows))


def _label_value(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in LABEL_VALUES:
        return LABEL_VALUES[value.strip().lower()]
    raise CalibrationError(f"{where}: field 'label': {value!r} is not one of "
                           "true/false/1/0/yes/no")


def _row(fields: dict[str, Any], where: str, line: int) -> Label:
    for name in ("key", "signal", "label"):
        if fields.get(name) is None:
            raise CalibrationError(f"{where}: field {name!r} is missing")
    key, signal = fields["key"], fields["signal"]
    if not isinstance(key, str) or not key:
        raise CalibrationError(f"{where}: field 'key': {key!r} is not a non-empty string")
    if not isinstance(signal, str) or not signal.strip():
        raise CalibrationError(f"{where}: field 'signal': {signal!r} is not a column name")
    return Label(key, signal.strip(), _label_value(fields["label"], where), line)


def parse_labels(data: bytes, uri: str) -> Labels:
    """Parse a labels file's bytes; the format comes from ``uri``'s extension: ``.csv``
    (a header naming ``key``, ``signal``, ``label``; other columns are ignored) or
    ``.jsonl``/``.ndjson`` (one JSON object per non-blank line with those fields).
    ``label``: true/false, 1/0, yes/no (any case), or a JSON boolean or 0/1.

    Raises ``CalibrationError`` naming ``uri``, the line and the field for an unknown
    extension, undecodable UTF-8, a missing column or field, a wrong number of CSV
    fields, a bad value, a ``(key, signal)`` labelled twice, or no rows at all."""
    ext = posixpath.splitext(uri.rstrip("/"))[1].lower()
    kinds = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
    if ext not in kinds:
        raise CalibrationError(f"labels file {uri}: extension {ext or '(none)'!r}: expected "
                               ".csv or .jsonl (rows: key, signal, label)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CalibrationError(f"labels file {uri}: not UTF-8 text ({e})") from None
    rows = _parse_csv(text, uri) if kinds[ext] == "csv" else _parse_jsonl(text, uri)
    if not rows:
        raise CalibrationError(f"labels file {uri}: no label rows")
    seen: dict[tuple[str, str], int] = {}
    for r in rows:
        first = seen.setdefault((r.key, r.signal), r.line)
        if first != r.line:
            raise CalibrationError(f"labels file {uri} line {r.line}: key {r.key!r} signal "
                                   f"{r.signal!r} is labelled again (first on line {first})")
    return Labels(uri, kinds[ext], hashlib.sha256(data).hexdigest(), rows)


_EXTRA = "\0extra"      # DictReader's key for the fields beyond the header's


def _parse_csv(text: str, uri: str) -> list[Label]:
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey=_EXTRA)
    try:
        header = reader.fieldnames or []
        missing = [c for c in ("key", "signal", "label") if c not in header]
        if missing:
            raise CalibrationError(f"labels file {uri} line 1: the header {header} has no "
                                   f"column(s) {missing} (expected key,signal,label)")
        rows = []
        for fields in reader:
            where = f"labels file {uri} line {reader.line_num}"
            if _EXTRA in fields:
                raise CalibrationError(f"{where}: {len(header) + len(fields[_EXTRA])} "
                                       f"fields, the header has {len(header)}")
            rows.append(_row(fields, where, reader.line_num))
    except csv.Error as e:
        raise CalibrationError(f"labels file {uri} line {reader.line_num}: {e}") from None
    return rows


def _parse_jsonl(text: str, uri: str) -> list[Label]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"labels file {uri} line {n}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise CalibrationError(f"{where}: not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise CalibrationError(f"{where}: a JSON {type(obj).__name__}, not an object "
                                   "with key, signal, label")
        rows.append(_row(obj, where, n))
    return rows


def read_labels(uri: str) -> Labels:
    """Read and parse the labels file at ``uri`` (local path or ``s3://``, through
    ``pipeline.storage.fs``). Raises ``CalibrationError`` (see ``parse_labels``; also
    for a missing file), ``StorageError`` if the store fails."""
    try:
        data = fs.read_bytes(uri)
    except FileNotFoundError:
        raise CalibrationError(f"labels file {uri}: not found") from None
    return parse_labels(data, uri)


# --- the curves ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Curve:
    """Precision, recall and F1 at every distinct score (float64 arrays of one length,
    ``thresholds`` increasing): at ``thresholds[i]``, rows with ``score >=
    thresholds[i]`` are predicted positive."""

    thresholds: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray

    @classmethod
    def of(cls, scores: np.ndarray, labels: np.ndarray) -> Curve:
        """The curve of ``scores`` (float, no NaN) against ``labels`` (bool), one per
        row, with at least one True label: ``sklearn.metrics.precision_recall_curve``
        (its last point, precision 1 / recall 0 with no threshold, left out). F1 =
        2PR/(P+R), 0 where P+R = 0."""
        from sklearn.metrics import precision_recall_curve

        p, r, t = precision_recall_curve(labels.astype(bool), scores.astype(np.float64))
        p, r = p[:-1], r[:-1]
        denom = p + r
        f1 = np.divide(2 * p * r, denom, out=np.zeros_like(denom), where=denom > 0)
        return cls(t.astype(np.float64), p, r, f1)

    def best_f1(self) -> int:
        """Index of the highest F1 (the lowest threshold among ties)."""
        return int(np.argmax(self.f1))

    def at_precision(self, precision: float) -> int | None:
        """Index of the smallest threshold whose precision is >= ``precision`` (the
        highest recall reaching it), or None if no threshold reaches it."""
        return _first_reaching(self.precision, precision)


def _first_reaching(precisions, target: float) -> int | None:
    hits = np.flatnonzero(np.asarray(precisions, dtype=np.float64) >= target)
    return int(hits[0]) if hits.size else None


def _point(curve: Curve, i: int | None) -> dict[str, float] | None:
    if i is None:
        return None
    return {"threshold": float(curve.thresholds[i]), "precision": float(curve.precision[i]),
            "recall": float(curve.recall[i]), "f1": float(curve.f1[i])}


def check_target(precision: float, what: str = "target precision") -> float:
    """``precision`` as a float if it is in (0, 1]; else ``CalibrationError``."""
    if not isinstance(precision, (int, float)) or isinstance(precision, bool) or not (
            0 < precision <= 1):
        raise CalibrationError(f"{what} {precision!r}: must be in (0, 1]")
    return float(precision)


def calibrate(table: pa.Table, labels: Labels, signals: list[str], target_precision: float,
              name: str, output: dict[str, Any]) -> dict[str, Any]:
    """The calibration document (what ``calibration.json`` holds) of ``signals`` (numeric
    columns of ``table``, which holds ``key`` and them: the committed rows, or those of
    them the labels name) against ``labels``.

    Per signal ``counts``: ``labelled`` (its label rows), ``missing_keys`` (keys not in
    ``table``), ``ambiguous_keys`` (keys on more than one row: unused), ``null_scores``
    (null or NaN score: unused), ``used``, ``positives``, ``negatives``; the first
    ``SAMPLE_KEYS`` keys of each unused kind; ``best_f1`` and ``at_target`` (threshold,
    precision, recall, f1; ``at_target`` None: unreachable); ``curve`` (thresholds,
    precision, recall, f1 lists). ``output``: what to record about the output (uri,
    generation, fingerprint). Raises ``CalibrationError`` for a signal that is not a
    numeric column, that has no label, or whose used rows have no positive label."""
    check_target(target_precision)
    keys = table.column("key").to_pylist()
    where: dict[str, int] = {}
    repeated: set[str] = set()
    for i, k in enumerate(keys):
        if where.setdefault(k, i) != i:
            repeated.add(k)
    doc_signals = {}
    for signal in signals:
        rows = [r for r in labels.rows if r.signal == signal]
        if not rows:
            raise CalibrationError(f"signal {signal!r}: labels file {labels.uri} has no "
                                   f"label for it (signals there: {labels.signals()})")
        col = table.column(signal)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)
                or pa.types.is_boolean(col.type)):
            raise CalibrationError(f"signal {signal!r}: column of type {col.type}, not a "
                                   "numeric score")
        values = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        missing, ambiguous, null, used = [], [], [], []
        for r in rows:
            if r.key not in where:
                missing.append(r.key)
            elif r.key in repeated:
                ambiguous.append(r.key)
            elif math.isnan(values[where[r.key]]):
                null.append(r.key)
            else:
                used.append(r)
        scores = np.array([values[where[r.key]] for r in used], dtype=np.float64)
        truth = np.array([r.label for r in used], dtype=bool)
        positives = int(truth.sum())
        counts = {"labelled": len(rows), "used": len(used), "positives": positives,
                  "negatives": len(used) - positives, "missing_keys": len(missing),
                  "ambiguous_keys": len(ambiguous), "null_scores": len(null)}
        if positives == 0:
            raise CalibrationError(
                f"signal {signal!r}: no positive (true) label among its {len(used)} usable "
                f"rows ({counts}): precision and recall are undefined; label some rows that "
                "have the property")
        curve = Curve.of(scores, truth)
        doc_signals[signal] = {
            "counts": counts,
            "unused_keys": {"missing": missing[:SAMPLE_KEYS], "ambiguous": ambiguous[:SAMPLE_KEYS],
                            "null_score": null[:SAMPLE_KEYS]},
            "best_f1": _point(curve, curve.best_f1()),
            "at_target": _point(curve, curve.at_precision(target_precision)),
            "curve": {"thresholds": curve.thresholds.tolist(),
                      "precision": curve.precision.tolist(), "recall": curve.recall.tolist(),
                      "f1": curve.f1.tolist()},
        }
    from pipeline import package_version

    return {
        "format": FORMAT, "version": VERSION, "name": name,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "mmpipe_version": package_version(), "direction": DIRECTION,
        "target_precision": float(target_precision),
        "labels": {"uri": labels.uri, "format": labels.format, "sha256": labels.sha256,
                   "rows": len(labels.rows),
                   "other_signal_rows": sum(r.signal not in signals for r in labels.rows)},
        "output": output, "signals": doc_signals,
    }


def output_identity(output: str, schema: pa.Schema | None = None) -> dict[str, Any]:
    """What a calibration records about the output it measured: ``uri``, ``generation``
    (the number of the one readers read: the newest complete, else the newest; None for
    an output without generations) and ``fingerprint`` (``mmpipe.fingerprint`` of
    ``schema``'s metadata, the committed data files'; None if absent). Raises
    ``PlanError`` for an unreadable generation record."""
    from pipeline.output.generations import list_generations, newest_complete

    gens = list_generations(output)
    gen = newest_complete(gens) or (gens[-1] if gens else None)
    raw = ((schema.metadata or {}) if schema is not None else {}).get(b"mmpipe.fingerprint")
    return {"uri": output, "generation": gen.number if gen else None,
            "fingerprint": raw.decode() if raw else None}


# --- files -------------------------------------------------------------------------------
def check_name(name: str) -> str:
    """``name`` if it is one path component of letters, digits, ``_``, ``.``, ``-``
    (starting with a letter or digit); else ``CalibrationError``."""
    if not isinstance(name, str) or not NAME.match(name):
        raise CalibrationError(f"calibration name {name!r}: use letters, digits, '_', '.', "
                               "'-' (starting with a letter or digit); set it with --name")
    return name


def default_name(labels_uri: str) -> str:
    """The labels file's stem (``labels/nsfw_v2.csv`` -> ``nsfw_v2``): a rerun with the
    same labels file replaces its calibration. Raises ``CalibrationError`` if the stem is
    not a valid name (``check_name``)."""
    return check_name(posixpath.splitext(posixpath.basename(labels_uri.rstrip("/")))[0])


def calibration_dir(output: str, name: str) -> str:
    """``<output>/_calibration/<name>`` (``output``: the sink.uri, or a generation root
    of it)."""
    from pipeline.output.generations import output_of

    return fs.join(output_of(fs.normalize(output)), CALIBRATION_DIR, check_name(name))


def write(output: str, doc: dict[str, Any]) -> str:
    """Write ``calibration.png`` then ``calibration.json`` (each atomically:
    ``fs.write_bytes``; local or S3) under ``calibration_dir(output, doc["name"])``;
    return the JSON file's URI. Raises ``StorageError``/``OSError`` if the store fails."""
    where = calibration_dir(output, doc["name"])
    fs.write_bytes(fs.join(where, PLOT_FILE), plot_png(doc))
    uri = fs.join(where, CALIBRATION_FILE)
    fs.write_bytes(uri, json.dumps(doc, indent=1, allow_nan=False).encode())
    return uri


def plot_png(doc: dict[str, Any]) -> bytes:
    """A PNG: per signal (one panel each), precision, recall and F1 against the
    threshold, with the best-F1 threshold and the one at the target precision marked.
    matplotlib's object API on the Agg canvas (no pyplot, no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    signals = doc["signals"]
    fig = Figure(figsize=(7, 3.2 * max(1, len(signals))), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(1, len(signals)), 1, squeeze=False)[:, 0]
    target = doc["target_precision"]
    for ax, (signal, s) in zip(axes, signals.items()):
        c = s["curve"]
        for key, style in (("precision", "-"), ("recall", "--"), ("f1", ":")):
            ax.step(c["thresholds"], c[key], style, where="pre", label=key)
        best = s["best_f1"]
        ax.axvline(best["threshold"], color="grey", lw=0.8)
        ax.axhline(target, color="red", lw=0.5, alpha=0.5)
        note = f"best F1 {best['f1']:.3f} at >= {best['threshold']:.4g}"
        if s["at_target"]:
            ax.axvline(s["at_target"]["threshold"], color="red", lw=0.8)
            note += f"; precision {target:g} at >= {s['at_target']['threshold']:.4g}"
        else:
            note += f"; precision {target:g} unreachable"
        n = s["counts"]
        ax.set_title(f"{signal}: {n['used']} labelled ({n['positives']} positive)\n{note}",
                     fontsize=9)
        ax.set_xlabel("threshold (positive iff score >= threshold)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def format_table(doc: dict[str, Any]) -> str:
    """The printed table: per signal, rows used, positives, best F1 and its threshold,
    the threshold at the target precision and its recall (or ``unreachable``), and the
    label rows not used (keys not in the output, keys on several rows, null scores)."""
    target = doc["target_precision"]
    head = (f"{'signal':<24} {'used':>6} {'pos':>6} {'best F1':>8} {'at >=':>12} "
            f"{f'P>={target:g} at >=':>16} {'recall':>7}  unused (missing/ambiguous/null)")
    lines = [head]
    for signal, s in doc["signals"].items():
        n, best, at = s["counts"], s["best_f1"], s["at_target"]
        at_t, at_r = (f"{at['threshold']:.6g}", f"{at['recall']:.3f}") if at else (
            "unreachable", "-")
        lines.append(f"{signal:<24} {n['used']:>6} {n['positives']:>6} {best['f1']:>8.3f} "
                     f"{best['threshold']:>12.6g} {at_t:>16} {at_r:>7}  "
                     f"{n['missing_keys']}/{n['ambiguous_keys']}/{n['null_scores']}")
    other = doc["labels"].get("other_signal_rows")
    if other:
        lines.append(f"({other} label rows of other signals not calibrated: --signal)")
    return "\n".join(lines)


def read(uri: str) -> dict[str, Any]:
    """The calibration document at ``uri`` (a ``calibration.json``, or the directory
    holding one; local or ``s3://``). Raises ``CalibrationError`` naming the file if it
    is missing, not JSON, or not a calibration of a known version."""
    if not uri.rstrip("/").endswith(".json"):
        uri = fs.join(uri, CALIBRATION_FILE)
    try:
        doc = json.loads(fs.read_bytes(uri))
    except FileNotFoundError:
        raise CalibrationError(f"calibration file {uri}: not found (write it with "
                               "`mmpipe calibrate`)") from None
    except ValueError as e:
        raise CalibrationError(f"calibration file {uri}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION \
            or not isinstance(doc.get("signals"), dict):
        raise CalibrationError(f"calibration file {uri}: not an mmpipe calibration "
                               f"(format {FORMAT!r} version {VERSION})")
    return doc


def threshold_for(uri: str, column: str, precision: float) -> float:
    """The smallest threshold of ``column``'s curve in the calibration at ``uri`` (see
    ``read``) whose precision is >= ``precision`` (in (0, 1]): keeping rows with ``score
    >= threshold`` keeps the most positives at that precision (on the labelled sample).

    Raises ``CalibrationError`` (a ``ValueError``) naming the file, the column and the
    precision when the file is unusable, the column was not calibrated there, the
    precision is out of range, or no threshold reaches it (naming the highest precision
    on the curve)."""
    check_target(precision, f"calibration {uri} column {column!r}: precision")
    doc = read(uri)
    if column not in doc["signals"]:
        raise CalibrationError(f"calibration {uri}: no column {column!r} (calibrated: "
                               f"{sorted(doc['signals'])})")
    curve = doc["signals"][column]["curve"]
    i = _first_reaching(curve["precision"], precision)
    if i is None:
        best = int(np.argmax(curve["precision"])) if curve["precision"] else None
        top = ("" if best is None else f"; the highest is {curve['precision'][best]:.4g} "
               f"at threshold {curve['thresholds'][best]:.6g}")
        raise CalibrationError(f"calibration {uri} column {column!r}: precision "
                               f"{precision:g} is not reachable{top}")
    return float(curve["thresholds"][i])


def list_calibrations(output: str, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """Summaries of the calibrations under ``<output>/_calibration/`` (one listing plus a
    read per calibration), by name: ``name``, ``uri``, ``created_at``,
    ``target_precision``, ``labels_sha256``, ``generation``, ``fingerprint`` and per
    signal ``used``, ``positives``, ``best_f1``, ``best_f1_threshold``,
    ``threshold_at_target`` and ``recall_at_target`` (None: unreachable). A damaged file
    is skipped with a line added to ``problems``."""
    from pipeline.output.generations import output_of

    root = fs.join(output_of(fs.normalize(output)), CALIBRATION_DIR)
    prefix = root.rstrip("/") + "/"
    out = []
    for e in fs.list_files(root):
        rel = e.uri[len(prefix):] if e.uri.startswith(prefix) else ""
        name, _, file = rel.partition("/")
        if file != CALIBRATION_FILE or not NAME.match(name):
            continue
        try:
            doc = read(e.uri)
            signals = {}
            for col, s in doc["signals"].items():
                at = s.get("at_target")
                signals[col] = {"used": s["counts"]["used"],
                                "positives": s["counts"]["positives"],
                                "best_f1": s["best_f1"]["f1"],
                                "best_f1_threshold": s["best_f1"]["threshold"],
                                "threshold_at_target": at["threshold"] if at else None,
                                "recall_at_target": at["recall"] if at else None}
            out.append({"name": name, "uri": e.uri, "created_at": doc.get("created_at"),
                        "target_precision": doc.get("target_precision"),
                        "labels_sha256": doc.get("labels", {}).get("sha256"),
                        "generation": doc.get("output", {}).get("generation"),
                        "fingerprint": doc.get("output", {}).get("fingerprint"),
                        "signals": signals})
        except (CalibrationError, KeyError, TypeError) as err:
            if problems is not None:
                problems.append(f"unreadable calibration {e.uri}: {err}"[:500])
    return out
