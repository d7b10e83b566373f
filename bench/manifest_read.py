"""Manifest reading cost (issue 11): mmpipe's robust reader vs pyarrow's CSV/JSON readers.

mmpipe reads CSV with Python's ``csv`` and JSONL with ``json`` per line (no type inference
from a first block, per-cell decoding, one error row per bad row); before issue 11 it used
``pyarrow.csv`` / ``pyarrow.json``, which are faster but lose or fail whole files on
quoted newlines, type changes and mixed encodings. This times, in one process, side by
side on the same generated file:

- ``mmpipe``: ``manifest.profile`` (the planning pass: rows, carried types, an offset
  every 10,000 rows) plus ``manifest.read_rows`` over the whole file in 10,000-row ranges,
  each seeking to its offset (as the partitions of a job do);
- ``pyarrow``: one ``pyarrow.csv.read_csv`` / ``pyarrow.json.read_json`` of the file
  (type inference from the data, no per-row decoding; a lower bound for any reader).

Usage: ``.venv/bin/python bench/manifest_read.py [rows] [repeats]`` (defaults 200000, 3).
Prints the median seconds of each and their ratio, and rows/s.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.json as pajson

from pipeline.input import manifest_rows as manifest

USED = ("path", "caption", "key")


def _write(path: Path, rows: int) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.suffix == ".csv":
            f.write("key,path,caption,score,source\n")
            for i in range(rows):
                f.write(f'{i:09d},img{i % 97}.jpg,"a photo, number {i}\nsecond line",'
                        f"{i * 0.5},src-{i % 13}\n")
        else:
            for i in range(rows):
                f.write(json.dumps({"key": f"{i:09d}", "path": f"img{i % 97}.jpg",
                                    "caption": f"a photo, number {i}\nsecond line",
                                    "score": i * 0.5, "source": f"src-{i % 13}"}) + "\n")


def _mmpipe(uri: str, step: int = 10_000) -> int:
    found = manifest.profile(uri, "auto", USED, every=step)
    offsets = {o.row: o for o in found.offsets}
    n = 0
    for start in range(0, found.rows, step):
        for rows in manifest.read_rows(uri, "auto", start, min(found.rows, start + step), USED,
                                       found.columns, 1024, offsets.get(start)):
            n += rows.num_rows
    return n


def _pyarrow(uri: str) -> int:
    if uri.endswith(".csv"):
        return pacsv.read_csv(uri, parse_options=pacsv.ParseOptions(
            newlines_in_values=True)).num_rows
    return pajson.read_json(uri).num_rows


def main(rows: int = 200_000, repeats: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for ext in (".csv", ".jsonl"):
            path = Path(tmp) / f"m{ext}"
            _write(path, rows)
            times: dict[str, list[float]] = {"mmpipe": [], "pyarrow": []}
            for _ in range(repeats):  # interleaved, so both see the same machine load
                for name, fn in (("mmpipe", _mmpipe), ("pyarrow", _pyarrow)):
                    t0 = time.perf_counter()
                    assert fn(str(path)) == rows, name
                    times[name].append(time.perf_counter() - t0)
            m, p = (statistics.median(times[k]) for k in ("mmpipe", "pyarrow"))
            print(f"{ext[1:]:5} {rows} rows, {path.stat().st_size / 2**20:.1f} MiB: "
                  f"mmpipe {m:.2f} s ({rows / m:,.0f} rows/s), pyarrow {p:.2f} s "
                  f"({rows / p:,.0f} rows/s), ratio {m / p:.1f}x")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
