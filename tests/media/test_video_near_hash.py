"""A video's near hash comes from several frames (finding 7, the video part).

The fault: ``phash`` was the pHash of the middle sampled frame, so every video whose middle
frame is black (a fade, a title card) hashed to ``0x0`` and was a near duplicate of every
other such video. Now it is the pHash of a 2 x 2 mosaic of 4 frames spread over the sample
(``media.video.near_hash``); a video whose hashed frames are all flat is ``low_detail``
(near dedup skips it). The videos are made here with PyAV from the bundled COCO photos.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from pipeline.columns import KEY, LOW_DETAIL, PHASH, REJECT_REASON, SHA256, STATUS
from pipeline.media.transform import phash64
from pipeline.media.video import decode_video, near_hash
from pipeline.spec import DedupSpec, VideoSpec
from pipeline.steps.dedup import DedupStep
from pipeline.steps.video import VideoDecodeStep

PHOTOS = Path(__file__).resolve().parents[2] / "data" / "photos"
W, H = 128, 96


def photo(name: str) -> np.ndarray:
    return np.asarray(Image.open(PHOTOS / name).convert("RGB").resize((W, H)))


def write(path: Path, frames: list[np.ndarray], bit_rate: int = 2_000_000) -> Path:
    """One frame per 0.1 s, mpeg4 at ``bit_rate`` bits/s."""
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt, s.bit_rate = W, H, "yuv420p", bit_rate
        for a in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def black_middle(name_a: str, name_b: str) -> list[np.ndarray]:
    """9 frames: 3 of photo a, 3 black, 3 of photo b (the middle one is black)."""
    black = np.zeros((H, W, 3), np.uint8)
    return [photo(name_a)] * 3 + [black] * 3 + [photo(name_b)] * 3


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("near")
    names = sorted(p.name for p in PHOTOS.glob("*.jpg"))
    black = np.zeros((H, W, 3), np.uint8)
    grey = np.full((H, W, 3), 90, np.uint8)
    return {
        "one": write(d / "one.mp4", black_middle(names[0], names[1])),
        "two": write(d / "two.mp4", black_middle(names[2], names[3])),
        "one_again": write(d / "one_again.mp4", black_middle(names[0], names[1]),
                           bit_rate=300_000),
        "black": write(d / "black.mp4", [black] * 9),
        "flat_colours": write(d / "flat_colours.mp4", [black] * 3 + [grey] * 6),
    }


SPEC = VideoSpec(sampling="uniform", num_frames=9)


def rows(paths: list[Path]) -> dict:
    step = VideoDecodeStep(SPEC)
    batch = step({STATUS: ["ok"] * len(paths), KEY: [p.stem for p in paths],
                  "_source_path": [str(p) for p in paths]})
    assert batch[STATUS] == ["ok"] * len(paths)
    return batch


def distance(a: int, b: int) -> int:
    return ((a ^ b) & (2**64 - 1)).bit_count()


def test_videos_sharing_a_black_middle_frame_are_not_near_duplicates(videos):
    one = decode_video(str(videos["one"]), SPEC)
    two = decode_video(str(videos["two"]), SPEC)
    # the old hash: the middle sampled frame, black in both, the same hash
    mid_one, mid_two = (phash64(i.frames[len(i.frames) // 2]) for i in (one, two))
    assert mid_one == mid_two
    (h1, low1), (h2, low2) = near_hash(one.frames), near_hash(two.frames)
    assert (low1, low2) == (False, False)
    assert distance(h1, h2) > DedupSpec().max_hamming_distance * 4
    batch = rows([videos["one"], videos["two"]])
    assert batch[PHASH] == [h1, h2]
    batch = DedupStep(DedupSpec(exact=True, near=True))(batch)
    assert batch[STATUS] == ["ok", "ok"] and batch[REJECT_REASON] == [None, None]


def test_a_reencode_of_the_same_video_is_still_a_near_duplicate(videos):
    batch = rows([videos["one"], videos["one_again"]])
    assert batch[SHA256][0] != batch[SHA256][1]
    assert distance(batch[PHASH][0], batch[PHASH][1]) <= DedupSpec().max_hamming_distance
    batch = DedupStep(DedupSpec(exact=True, near=True))(batch)
    assert batch[STATUS] == ["ok", "rejected"] and batch[REJECT_REASON][1] == "duplicate"


def test_a_video_of_flat_frames_is_low_detail_and_not_a_near_duplicate(videos):
    batch = rows([videos["black"], videos["flat_colours"], videos["one"]])
    assert batch[LOW_DETAIL] == [True, True, False]
    batch = DedupStep(DedupSpec(exact=True, near=True))(batch)
    assert batch[STATUS] == ["ok", "ok", "ok"]


def test_near_hash_of_one_frame_is_its_phash():
    a = photo(min(p.name for p in PHOTOS.glob("*.jpg")))
    assert near_hash([a]) == (phash64(a), False)
    with pytest.raises(ValueError):
        near_hash([])
