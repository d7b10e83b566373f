"""Frame-level dedup (issue 25 item 6): each video row's sampled-frame pHashes go into the
near index, so a re-encoded copy of part of a video (another size and bitrate) is found
inside the whole video, with the frames that matched. The pure path (decode, signals,
index files, bucket pairs, union) runs here without Ray; the slow test runs it as users
do (``mmpipe run`` then ``mmpipe dedup``) and reads the duplicates table back."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.columns import FRAME_PHASHES, KEY, PHASH, SHA256, SOURCE_PATH, STATUS
from pipeline.dedup import groups, index, tasks
from pipeline.spec import DatasetDedupSpec, VideoSpec
from pipeline.steps.clip_signals import ClipSignalsStep
from pipeline.steps.video import VideoDecodeStep
from tests.dedup.reencode import reencode_span

VIDEOS = Path(__file__).resolve().parents[2] / "data" / "videos"
CHAPLIN = VIDEOS / "chaplin.mp4"
SAMPLING = VideoSpec(sampling="fps", fps=2.0)       # a frame every 0.5 s
START_S = 3.0                                        # the copy starts here: frame 6


def inputs(tmp: Path) -> dict[str, list[Path]]:
    """Two partitions: the three real videos, then a 4 s span of Chaplin re-encoded at
    320x180 and 150 kbit/s (the original: 640x360, ~630 kbit/s)."""
    copy = reencode_span(CHAPLIN, tmp / "chaplin_span.mp4", START_S, START_S + 4.0, 320,
                         180, 150_000)
    return {"p-000000": sorted(VIDEOS.iterdir()), "p-000001": [copy]}


def pairs_of(parts: dict[str, list[Path]], frames: bool) -> pa.Table:
    """Decode each partition, index it (``index.index_tables``) and run every near and
    exact bucket (``tasks.bucket_pairs``) over both partitions' index rows."""
    spec = DatasetDedupSpec(enabled=True, buckets=4)
    by_bucket = defaultdict(list)
    for pid, paths in parts.items():
        batch = {SOURCE_PATH: [str(p) for p in paths], STATUS: ["ok"] * len(paths),
                 KEY: [p.stem for p in paths]}
        batch = ClipSignalsStep()(VideoDecodeStep(SAMPLING)(batch))
        assert batch[STATUS] == ["ok"] * len(paths)
        tables = index.index_tables(batch[KEY], pid, list(range(len(paths))), batch[SHA256],
                                    batch[PHASH], spec, batch[FRAME_PHASHES] if frames else None)
        for where, table in tables.items():
            by_bucket[where].append(table)
    settings = {"max_hamming_distance": spec.max_hamming_distance, "frames": frames}
    found = [tasks.bucket_pairs(kind, pa.concat_tables(t), set(parts), settings)
             for (kind, _), t in sorted(by_bucket.items())]
    return pa.concat_tables(found)


def test_a_reencoded_span_is_found_inside_the_video_with_its_frames(tmp_path):
    parts = inputs(tmp_path)
    dups = groups.duplicates(pairs_of(parts, frames=True), frames=True).to_pylist()
    assert len(dups) == 1, dups
    (dup,) = dups
    assert (dup["key"], dup["partition_id"], dup["row"]) == ("chaplin_span", "p-000001", 0)
    assert (dup["duplicate_of"], dup["matched_key"]) == ("chaplin", "chaplin")
    assert (dup["kind"], dup["group_size"]) == ("near", 2)
    assert dup["hamming"] <= 4
    # frame k of the copy (k * 0.5 s) is frame k + 6 of the original (3 s + k * 0.5 s)
    assert dup["frame_index"] is not None
    assert dup["matched_frame"] == dup["frame_index"] + int(START_S * SAMPLING.fps)


def test_without_frame_rows_the_copy_is_not_found_and_the_table_is_unchanged(tmp_path):
    pairs = pairs_of(inputs(tmp_path), frames=False)
    assert pairs.schema == groups.PAIRS_SCHEMA
    dups = groups.duplicates(pairs)
    assert dups.schema == groups.DUPLICATES_SCHEMA and dups.num_rows == 0


def test_frames_of_one_video_never_pair_with_each_other():
    still = [0x0F0F_1234_5678_9ABC] * 4              # a still video: 4 equal frame hashes
    spec = DatasetDedupSpec(enabled=True, buckets=1)
    (table,) = [t for (kind, _), t in index.index_tables(
        ["still"], "p-000000", [0], [None], [None], spec, [still]).items() if kind == "near"]
    assert table.num_rows == 4 * (spec.max_hamming_distance + 1)
    assert sorted(set(table["frame"].to_pylist())) == [0, 1, 2, 3]
    pairs = tasks.bucket_pairs("near", table, {"p-000000"},
                               {"max_hamming_distance": 4, "frames": True})
    assert pairs.num_rows == 0


SPEC = """\
name: frame-dedup
source: {{kind: files, uri: {inp}, media: video, partition_size: 3}}
sink: {{uri: {out}}}
video: {{sampling: fps, fps: 2.0}}
filters: {{clips: {{enabled: true}}}}
text_embedding: {{enabled: false}}
dedup:
  dataset: {{enabled: true, buckets: 4}}
runtime: {{batch_size: 4, num_workers: 1, max_attempts: 1}}
"""


@pytest.mark.slow
def test_mmpipe_dedup_reports_the_clip_pair_and_the_frames(tmp_path):
    from deltalake import DeltaTable

    from pipeline.dedup.store import latest_duplicates
    from pipeline.read import read_output
    from tests.dedup.test_dedup_pass import mmpipe

    inp = tmp_path / "in"
    inp.mkdir()
    for p in sorted(VIDEOS.iterdir()):
        shutil.copyfile(p, inp / p.name)        # a link out of the input root is refused
    reencode_span(CHAPLIN, inp / "zz_chaplin_span.mp4", START_S, START_S + 4.0, 320, 180,
                  150_000)                     # sorts last: its own partition
    out, spec = tmp_path / "out", tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(inp=inp, out=out))
    run = mmpipe(tmp_path / "home", "run", str(spec))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = read_output(str(out), ["key", "status", "static_fraction", "frame_phashes"]
                       ).to_table().to_pylist()
    assert sorted(r["key"] for r in rows) == ["big_buck_bunny_432_433", "chaplin",
                                              "nasa_13013", "zz_chaplin_span"]
    assert all(r["status"] == "ok" and r["frame_phashes"] for r in rows), rows
    dups = latest_duplicates(str(out)).to_pylist()
    assert [(d["key"], d["duplicate_of"], d["matched_frame"] - d["frame_index"])
            for d in dups] == [("zz_chaplin_span", "chaplin", 6)]
    table = DeltaTable(str(out / "_dedup" / "duplicates")).to_pyarrow_table()
    assert table.num_rows == 1 and {"frame_index", "matched_frame"} <= set(table.column_names)
