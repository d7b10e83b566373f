"""The sections of what is done to each record's media and caption: ``captions``
(normalisation flags), ``decode`` (image decoding limits and device), ``video`` (decoding,
frame sampling, ``video.clips`` and their files) and ``resize`` (the output ``image``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.spec.base import FieldNotApplicable, _Strict


class CaptionSpec(_Strict):
    """Caption normalisation: captions are kept in full; these only set flags."""

    long_caption_chars: int = Field(1000, ge=1, description="Flag `long_caption` above this many "
                                    "characters (the caption itself is stored in full up to "
                                    "`max_caption_chars`).")
    max_caption_chars: int = Field(65_536, ge=1, description="Captions longer than this many "
                                   "characters are cut to it and flagged `caption_truncated` "
                                   "(a huge caption would otherwise reach the text model).")
    fallback_encoding: str = Field("cp1252", description="Encoding tried when caption bytes are "
                                   "not valid UTF-8 (flag `encoding_fixed`); if that fails too, "
                                   "invalid bytes become U+FFFD (flag `invalid_utf8`).")


class DecodeSpec(_Strict):
    """Image decoding: limits, and where model inputs are decoded."""

    max_pixels: int = Field(89_478_485, ge=1, description="Reject images whose header claims more "
                            "than this many pixels (width*height), before decoding. Default is "
                            "Pillow's MAX_IMAGE_PIXELS.")
    max_bytes: int = Field(64 * 2**20, ge=1, description="Reject source files larger than this "
                           "(bytes) without reading them fully.")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where model inputs are decoded. `cpu`: on the partition workers "
        "(Pillow). `cuda`: RGB and greyscale JPEGs (no ICC profile, or an sRGB one) go "
        "encoded to the `image_embedding` model actors and are decoded there in batches "
        "(nvJPEG through torchvision when the actor has a GPU, else Pillow in the actor), "
        "EXIF orientation applied; the actor also makes their `image` (resized, "
        "re-encoded: nvJPEG for JPEG on a GPU) and the worker decodes them only to a small "
        "JPEG draft for `phash` (which may differ from `cpu`'s by a few bits). Every other "
        "image is decoded on the worker as with `cpu` (counted by reason in the actor's "
        "stats). Image jobs with `image_embedding` and without `captioning` only.")


class ClipTranscodeSpec(_Strict):
    """How each clip is written as its own file (H.264 in MP4 via PyAV/FFmpeg)."""

    enabled: bool | None = Field(
        None, description="Write a clip file per clip (`clip_path`, `clip_bytes`). "
        "Default: true when `video.clips.method` is not `none`.")
    codec: Literal["libx264", "copy"] = Field(
        "libx264", description="`libx264`: re-encode to H.264 (exact span); `copy`: cut on "
        "key frames without re-encoding (fast; the clip starts at the key frame at or "
        "before its start).")
    crf: int = Field(23, ge=0, le=51, description="`libx264`: constant rate factor (0 "
                     "lossless .. 51 worst; 23 is x264's default). Ignored when `bitrate` "
                     "is set.")
    bitrate: int | None = Field(None, gt=0, description="`libx264`: target bitrate in bits "
                                "per second instead of `crf`. Default: none (crf).")
    max_size_px: int | None = Field(None, ge=2, description="`libx264`: longest side of the "
                                    "clip in pixels (downscaled, aspect kept, even sizes). "
                                    "Default: none (the source size).")
    fps: float | None = Field(None, gt=0, description="`libx264`: output frames per second. "
                              "Default: none (the source rate).")


class ClipsSpec(_Strict):
    """Splitting each video into clips: one output row (and clip file) per clip."""

    method: Literal["none", "scenes", "fixed"] = Field(
        "none", description="`none`: one row per video (no clips); `scenes`: shots found by "
        "PySceneDetect's `detector`; `fixed`: a clip every `clip_s` seconds.")
    detector: Literal["content", "adaptive"] = Field(
        "content", description="`scenes`: PySceneDetect's ContentDetector or "
        "AdaptiveDetector.")
    threshold: float | None = Field(None, gt=0, description="`scenes`: the detector's "
                                    "threshold (its own scale). Default: PySceneDetect's "
                                    "default for the detector.")
    clip_s: float = Field(10.0, gt=0, description="`fixed`: clip length in seconds.")
    overlap_s: float = Field(0.0, ge=0, description="`fixed`: seconds each clip overlaps the "
                             "previous one (less than `clip_s`).")
    min_clip_s: float = Field(1.0, ge=0, description="Shortest clip in seconds; shorter ones "
                              "are dropped.")
    max_clip_s: float = Field(60.0, gt=0, description="Longest clip in seconds; a longer shot "
                              "is cut into several clips.")
    max_clips: int = Field(500, ge=1, description="Most clips per video (the first ones in "
                           "time).")
    transcode: ClipTranscodeSpec = Field(ClipTranscodeSpec(), description="The clip files.")

    @model_validator(mode="after")
    def _lengths(self) -> "ClipsSpec":
        """overlap_s < clip_s and min_clip_s <= max_clip_s."""
        if self.overlap_s >= self.clip_s:
            raise ValueError(f"video.clips.overlap_s ({self.overlap_s}) must be less than "
                             f"clip_s ({self.clip_s})")
        if self.min_clip_s > self.max_clip_s:
            raise ValueError(f"video.clips.min_clip_s ({self.min_clip_s}) must not exceed "
                             f"max_clip_s ({self.max_clip_s})")
        if self.method == "none" and self.transcode.enabled:
            raise FieldNotApplicable([("transcode.enabled", True, "needs "
                                       "video.clips.method scenes or fixed")])
        return self

    @property
    def enabled(self) -> bool:
        """True when videos are split into clips (`method` is not `none`)."""
        return self.method != "none"

    @property
    def writes_files(self) -> bool:
        """True when each clip is written as a file (`transcode.enabled`, default: `enabled`)."""
        if self.transcode.enabled is None:
            return self.enabled
        return self.transcode.enabled and self.enabled


class VideoSpec(_Strict):
    """Video decoding (PyAV/FFmpeg) and frame sampling by presentation timestamp."""

    sampling: Literal["fps", "uniform", "keyframes", "scene"] = Field(
        "uniform", description="`fps`: one frame per 1/fps seconds of presentation time; "
        "`uniform`: num_frames frames at evenly spaced timestamps over the decoded span; "
        "`keyframes`: the key frames; `scene`: the first frame and every frame whose "
        "difference to the previous frame exceeds scene_threshold.")
    fps: float = Field(1.0, gt=0, description="`fps` sampling: frames per second.")
    num_frames: int = Field(8, ge=1, description="`uniform` sampling: frames per video.")
    scene_threshold: float = Field(0.2, gt=0, le=1, description="`scene` sampling: mean "
                                   "absolute difference of consecutive 64x36 grey frames "
                                   "(0..1) that starts a new scene.")
    max_frames: int = Field(64, ge=1, description="Most frames sampled per video (any mode; "
                            "evenly thinned beyond this).")
    max_frame_pixels: int = Field(
        4096 * 2160, ge=1, description="Largest frame (coded width*height, pixels) decoded: "
        "a video whose stream or any frame is larger is a `too_large` error row, checked "
        "before its frames are decoded. Default: DCI 4K.")
    max_decode_s: float = Field(
        300.0, gt=0, description="Most wall-clock seconds spent decoding one video (all its "
        "passes); beyond this it is a `decode_timeout` error row.")
    allow_playlists: bool = Field(
        False, description="Open containers that name other files (HLS `.m3u8`, DASH "
        "`.mpd`, ffconcat lists, image sequences, ...). Default: refused, an "
        "`unsupported_format` error row before any named file is read, and FFmpeg may open "
        "nothing but the video itself. true: their entries are read from the local "
        "filesystem (never the network) WITHOUT the input-root checks: trusted input only.")
    temp_dir: str | None = Field(None, description="Where videos from object storage are "
                                 "staged (one temporary file per video in flight, deleted "
                                 "after decoding); default: the system temp dir.")
    clips: ClipsSpec = Field(ClipsSpec(), description="Split each video into clips (shots or "
                             "fixed lengths): one row per clip, key `<video key>/<clip "
                             "index>`, and a clip file each.")


class ResizeSpec(_Strict):
    """Resize and re-encode of the output `image` column."""

    mode: Literal["shorter_side", "center_crop", "longest_side", "none"] = Field(
        "shorter_side", description="`shorter_side`: shorter side to size_px, keep ratio; "
        "`center_crop`: shorter side to size_px then centre crop size_px x size_px; "
        "`longest_side`: longest side to size_px; `none`: keep decoded size.")
    size_px: int = Field(256, ge=8, le=16384, description="Target size in pixels.")
    upscale: bool = Field(False, description="Allow enlarging images smaller than size_px.")
    encode_format: Literal["jpeg", "webp"] = Field("jpeg", description="Output image codec.")
    quality: int = Field(90, ge=1, le=100, description="Encoder quality (1-100).")
