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
from pipeline.spec import ClipsSpec, DatasetDedupSpec, DecodeSpec, VideoSpec
from pipeline.steps.clip_signals import ClipSignalsStep
from pipeline.steps.clips import ClipSplitStep
from pipeline.steps.video import VideoDecodeStep
from tests.dedup.reencode import reencode_span, save_frame

VIDEOS = Path(__file__).resolve().parents[2] / "data" / "videos"
CHAPLIN = VIDEOS / "chaplin.mp4"
SAMPLING = VideoSpec(sampling="fps", fps=2.0)       # a frame every 0.5 s
START_S = 3.0                                        # the copy starts here: frame 6
STILL_S = 5.0                                        # the stills show this frame: frame 10
THIRDS = ClipsSpec(method="fixed", clip_s=3.0)       # chaplin: [0, 3), [3, 6), [6, 9)


def inputs(tmp: Path) -> dict[str, list[Path]]:
    """Two partitions: the three real videos, then a 4 s span of Chaplin re-encoded at
    320x180 and 150 kbit/s (the original: 640x360, ~630 kbit/s)."""
    copy = reencode_span(CHAPLIN, tmp / "chaplin_span.mp4", START_S, START_S + 4.0, 320,
                         180, 150_000)
    return {"p-000000": sorted(VIDEOS.iterdir()), "p-000001": [copy]}


def pairs_of(parts: dict[str, list[Path]], frames: bool, images: bool = False,
             clips: ClipsSpec | None = None) -> pa.Table:
    """Decode each partition (``images``: still images as one-frame rows; ``clips``: split
    into clip rows first), index it (``index.index_tables``) and run every near and
    exact bucket (``tasks.bucket_pairs``) over both partitions' index rows."""
    spec = DatasetDedupSpec(enabled=True, buckets=4)
    sampling = SAMPLING if clips is None else VideoSpec(sampling="fps", fps=2.0, clips=clips)
    by_bucket = defaultdict(list)
    for pid, paths in parts.items():
        batch = {SOURCE_PATH: [str(p) for p in paths], STATUS: ["ok"] * len(paths),
                 KEY: [p.stem for p in paths]}
        if clips is not None:
            batch = ClipSplitStep(clips, images=images)(batch)
        decode = VideoDecodeStep(sampling, images=DecodeSpec() if images else None)
        batch = ClipSignalsStep()(decode(batch))
        assert set(batch[STATUS]) == {"ok"}, batch.get("error")
        tables = index.index_tables(batch[KEY], pid, list(range(len(batch[KEY]))),
                                    batch[SHA256], batch[PHASH], spec,
                                    batch[FRAME_PHASHES] if frames else None)
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


def stills(tmp: Path) -> list[Path]:
    """Chaplin's frame at ``STILL_S`` as a JPEG (640x360) and a smaller copy (320x180)."""
    return [save_frame(CHAPLIN, STILL_S, tmp / "still.jpg"),
            save_frame(CHAPLIN, STILL_S, tmp / "still_small.jpg", width=320, quality=80)]


def test_an_image_that_is_a_frame_of_a_video_is_found_with_the_frame(tmp_path):
    parts = {"p-000000": sorted(VIDEOS.iterdir()) + stills(tmp_path)}
    dups = groups.duplicates(pairs_of(parts, frames=True, images=True), frames=True)
    found = {d["key"]: d for d in dups.to_pylist()}
    assert sorted(found) == ["still", "still_small"], found
    for d in found.values():
        assert (d["duplicate_of"], d["matched_key"], d["kind"]) == ("chaplin", "chaplin", "near")
        assert d["group_size"] == 3 and d["hamming"] <= 4
        # the image's own pHash (frame_index null) met chaplin's sampled frame at 5.0 s
        assert d["matched_frame"] == int(STILL_S * SAMPLING.fps)


def test_a_reencoded_clip_is_found_as_a_clip_pair_with_its_frames(tmp_path):
    """The issue's done-when case without Ray: chaplin split into 3 s clips, and its clip
    1 ([3, 6) s) re-encoded at 320x180 (also split: one clip, ``zz_copy/0``)."""
    copy = reencode_span(CHAPLIN, tmp_path / "zz_copy.mp4", START_S, START_S + 3.0, 320,
                         180, 150_000)
    parts = {"p-000000": [CHAPLIN], "p-000001": [copy]}
    dups = groups.duplicates(pairs_of(parts, frames=True, clips=THIRDS), frames=True)
    found = {d["key"]: d for d in dups.to_pylist()}
    copy_row = found["zz_copy/0"]
    assert (copy_row["matched_key"], copy_row["kind"]) == ("chaplin/1", "near")
    # both clips start at 3.0 s: frame k of the copy is frame k of chaplin/1
    assert copy_row["frame_index"] is not None
    assert copy_row["matched_frame"] == copy_row["frame_index"]
    group = {copy_row["duplicate_of"]} | {k for k, d in found.items()
                                           if d["duplicate_of"] == copy_row["duplicate_of"]}
    assert {"chaplin/1", "zz_copy/0"} <= group


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


MIXED_SPEC = """\
name: cross-modal
source: {{kind: files, uri: {inp}, media: video, extensions: [.mp4, .webm, .jpg],
          partition_size: {size}}}
sink: {{uri: {out}}}
video: {{sampling: fps, fps: 2.0{clips}}}
text_embedding: {{enabled: false}}
dedup:
  dataset: {{enabled: true, buckets: 4, frames: true}}
runtime: {{batch_size: 4, num_workers: 1, max_attempts: 1}}
"""


def run_and_dedup(tmp: Path, inp: Path, size: int, clips: str = "") -> tuple[Path, list]:
    """``mmpipe run`` a video job that also lists ``.jpg`` over ``inp``, then ``mmpipe
    dedup`` its output; returns the output and the duplicates table's rows."""
    from pipeline.dedup.store import latest_duplicates
    from tests.dedup.test_dedup_pass import mmpipe

    out, spec = tmp / "out", tmp / "spec.yaml"
    spec.write_text(MIXED_SPEC.format(inp=inp, out=out, size=size, clips=clips))
    for args in (("run", str(spec)), ("dedup", str(out), "--workers", "1")):
        done = mmpipe(tmp / "home", *args)
        assert done.returncode == 0, done.stdout + done.stderr
    return out, latest_duplicates(str(out)).to_pylist()


@pytest.mark.slow
def test_mmpipe_dedup_reports_an_image_that_is_a_frame_of_a_video(tmp_path):
    from pipeline.read import read_output

    inp = tmp_path / "in"
    inp.mkdir()
    for p in (CHAPLIN, VIDEOS / "nasa_13013.mp4"):
        shutil.copyfile(p, inp / p.name)
    stills(inp)
    # 3 a partition: still_small is alone in p-000001 (beside still, the partition's own
    # near dedup would reject it as still's duplicate before the dataset pass)
    out, dups = run_and_dedup(tmp_path, inp, size=3)
    rows = {r["key"]: r for r in read_output(str(out), [
        "key", "status", "frame_count", "duration_s", "mime", "frame_phashes"]).to_table(
    ).to_pylist()}
    assert sorted(rows) == ["chaplin", "nasa_13013", "still", "still_small"]
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert [(rows[k]["frame_count"], rows[k]["duration_s"], rows[k]["mime"])
            for k in ("still", "still_small")] == [(1, 0.0, "image/jpeg")] * 2
    assert len(rows["still"]["frame_phashes"]) == 1
    assert sorted((d["key"], d["duplicate_of"], d["matched_key"], d["matched_frame"])
                  for d in dups) == [("still", "chaplin", "chaplin", 10),
                                     ("still_small", "chaplin", "chaplin", 10)]


@pytest.mark.slow
def test_mmpipe_dedup_reports_a_reencoded_clip_and_keeps_clip_keys_unique(tmp_path):
    """The issue's done-when test: chaplin split into 3 s clips (``fixed``), a re-encoded
    copy of its clip 1 (``zz_copy``, split too: ``zz_copy/0``), and Chaplin's frame at 5 s
    as ``chaplin/1.jpg``, whose key ``chaplin/1`` is also clip 1's (both in p-000000; the
    copy alone in p-000001, so the partition's own near dedup does not reject it first)."""
    from pipeline.read import read_output

    inp = tmp_path / "in"
    (inp / "chaplin").mkdir(parents=True)
    shutil.copyfile(CHAPLIN, inp / "chaplin.mp4")
    save_frame(CHAPLIN, STILL_S, inp / "chaplin" / "1.jpg")
    reencode_span(CHAPLIN, inp / "zz_copy.mp4", START_S, START_S + 3.0, 320, 180, 150_000)
    out, dups = run_and_dedup(tmp_path, inp, size=2,
                              clips=", clips: {method: fixed, clip_s: 3.0}")
    rows = {r["key"]: r for r in read_output(str(out), [
        "key", "status", "parent_key", "clip_path", "frame_count"]).to_table().to_pylist()}
    # chaplin.mp4 sorts before chaplin/1.jpg: the image's key takes the suffix
    assert sorted(rows) == ["chaplin/0", "chaplin/1", "chaplin/1%2A1", "chaplin/2",
                            "zz_copy/0"]
    assert all(r["status"] == "ok" for r in rows.values()), rows
    image = rows["chaplin/1%2A1"]
    assert (image["parent_key"], image["clip_path"], image["frame_count"]) == (None, None, 1)
    assert rows["chaplin/1"]["parent_key"] == "chaplin" and rows["chaplin/1"]["clip_path"]
    found = {d["key"]: d for d in dups}
    copy = found["zz_copy/0"]
    assert copy["matched_key"] == "chaplin/1"
    assert copy["frame_index"] is not None and copy["matched_frame"] == copy["frame_index"]
    # the still is clip 1's frame at 5.0 s: sampled frame (5.0 - 3.0) * 2 of chaplin/1
    still = found["chaplin/1%2A1"]
    assert (still["matched_key"], still["matched_frame"]) == ("chaplin/1", 4)
