"""bench/peers.py (issue 32, point 5): the shared Pillow code equals mmpipe's own resize
path, the output checks catch what they must, the tables compute the ratios, and the
whole bench runs twice in one work dir with real mmpipe, bare Pillow and (where the bench
extra is installed) Daft."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO / "data" / "photos"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


peers = _load("peers")


def _jpeg(w: int, h: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    # smooth content (a gradient plus mild noise) so JPEG and resampling behave as on photos
    x = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
    px = np.clip(x + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def test_pillow_job_is_mmpipe_center_crop_byte_for_byte(tmp_path):
    """pillow_job gives the bytes of mmpipe's decode (JPEG draft) + resize_pixels
    (center_crop 224) + encode (JPEG q90) on real photos without an ICC profile (mmpipe
    converts one to sRGB, bare Pillow does not), the bench's own inputs (which carry
    none: ``throughput.make_copy`` writes no profile), a large and a small image."""
    from pipeline.media.decode import decode_image
    from pipeline.media.transform import encode, resize_pixels
    from pipeline.spec import ResizeSpec

    rspec = ResizeSpec(mode="center_crop", size_px=224, encode_format="jpeg", quality=90)
    plain = [p for p in sorted(PHOTOS.glob("*.jpg")) if not Image.open(p).info.get("icc_profile")]
    assert len(plain) >= 30
    with_icc = min(set(PHOTOS.glob("*.jpg")) - set(plain))
    made = tmp_path / "copy.jpg"
    throughput = _load("throughput")
    stats = throughput.make_copy((str(with_icc), str(made), 3, "0"))
    assert 1.0 <= stats["width"] * stats["height"] / 1e6 <= 3.0
    assert Image.open(made).info.get("icc_profile") is None
    inputs = [p.read_bytes() for p in plain[:3]] + [made.read_bytes()]
    inputs += [_jpeg(2400, 1100), _jpeg(150, 100)]
    for data in inputs:
        ours = peers.pillow_job(data)
        img = decode_image(data, draft_min_side_px=224)
        assert ours == encode(resize_pixels(img.pixels, rspec), rspec)
    assert Image.open(io.BytesIO(peers.pillow_job(inputs[-2]))).size == (224, 224)
    assert Image.open(io.BytesIO(peers.pillow_job(inputs[-1]))).size == (100, 100)  # no upscale


def test_checks_catch_missing_rows_wrong_sizes_and_pixel_differences():
    good = peers.pillow_job(_jpeg(800, 600, 1))
    other = peers.pillow_job(_jpeg(800, 600, 2))  # same size, other noise
    small = peers.pillow_job(_jpeg(150, 100))
    keys = ["a", "b"]
    assert peers.check_rows("pillow", {"a": good, "b": good}, keys) == []
    problems = peers.check_rows("mmpipe", {"a": good, "c": small}, keys)
    assert problems == ["mmpipe: 2 rows for 2 inputs (1 missing, 1 unknown keys)",
                        "mmpipe: 1 images not 224x224 (e.g. c)"]
    # same code must be byte-identical; another kernel within its tolerance only
    assert peers.pixel_diff(good, good) == (0.0, 0)
    mean, peak = peers.pixel_diff(good, other)
    assert 0 < mean < 12 and peak > 0
    lines, bad = peers.compare({"pillow": {"a": good, "b": good},
                                "raydata": {"a": good, "b": other},
                                "daft-native": {"a": other, "b": other}}, ["a", "b"])
    assert bad == ["raydata: 1 images differ from pillow's bytes",
                   f"raydata: mean |pixel diff| {mean:.2f} against pillow > 0.0"]
    assert any(line.startswith("daft-native vs pillow on 2 rows at 1/4 scale: mean")
               for line in lines)
    # at 1/4 scale the per-pixel noise averages out: a smaller difference
    assert peers.pixel_diff(good, other, 4)[0] < mean
    # an all-white image is far outside Daft's tolerance
    white = io.BytesIO()
    Image.new("RGB", (224, 224), "white").save(white, format="JPEG")
    _, bad = peers.compare({"pillow": {"a": good}, "daft-native": {"a": white.getvalue()}}, ["a"])
    assert len(bad) == 1 and bad[0].startswith("daft-native: mean |pixel diff|")
    with pytest.raises(ValueError, match="image sizes differ: 224x224 vs 100x100"):
        peers.pixel_diff(good, small)


def test_tables_take_medians_and_mmpipe_ratios():
    def run(s, load=0.5):
        return {"rc": 0, "to_output_s": s, "exit_s": s + 1, "cpu_s": 2 * s,
                "peak_rss_mib": 100, "load": load}
    results = {100: {"mmpipe": [run(10), run(9), run(30)], "pillow": [run(5), run(4), run(6)],
                     "daft-udf": [run(5), {"rc": 1, "to_output_s": None, "load": 1.0}]}}
    text = peers.tables(results, cores=2)
    # mmpipe: median 10 s -> 10 img/s; pillow median 5 s -> 20 img/s; daft-udf 5 s (one ok)
    assert "| 100 | mmpipe run | 10.0 | 10.0 (9.0-30.0) | 11.0 | 20.0 | 100 | 0.50, 0.50, 0.50 |" in text
    assert "| 100 | bare Pillow, 1 process per core | 20.0 | 5.0 (4.0-6.0) |" in text
    assert "| N | mmpipe img/s | vs Daft + the Pillow UDF | vs bare Pillow, 2 processes |" in text
    assert "| 100 | 10.0 | 0.50x | 0.50x |" in text


def test_bad_arguments_name_the_option(tmp_path):
    for args, message in ((["--variants", "pillow,polars"], "--variants: unknown ['polars']"),
                          (["--sizes", "10,x"], "--sizes: comma-separated image counts"),
                          (["--repeats", "0"], "--repeats: must be >= 1, got 0"),
                          (["--cores", "0"], "--cores: must be >= 1, got 0")):
        with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
            peers.main(args + ["--workdir", str(tmp_path)])


def test_peers_bench_runs_twice_in_one_workdir(tmp_path):
    """The real bench at 12 images, then again in the same work dir (inputs reused, outputs
    replaced): every variant's rows and sizes checked, pixels compared, tables written."""
    variants = ["mmpipe", "pillow"]
    try:
        import daft  # noqa: F401 - the bench extra
        variants += ["daft-udf", "daft-native"]
    except ImportError:
        pass
    for run in (1, 2):
        proc = subprocess.run(
            [sys.executable, str(REPO / "bench" / "peers.py"), "--sizes", "12", "--repeats", "1",
             "--variants", ",".join(variants), "--workdir", str(tmp_path), "--check-rows", "4"],
            capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
        assert proc.returncode == 0, (run, proc.stdout[-3000:], proc.stderr[-3000:])
        assert ("built 12 input images" in proc.stdout) == (run == 1)
    results = sorted((tmp_path / "results").glob("peers-*.json"))
    summary = json.loads(results[-1].read_text())
    assert summary["problems"] == []
    by_v = summary["results"]["12"]
    assert sorted(by_v) == sorted(variants)
    for v, runs in by_v.items():
        (r,) = runs
        assert r["rc"] == 0 and 0 < r["to_output_s"] <= r["exit_s"] + 0.5, (v, r)
        assert r["cpu_s"] > 0 and r["peak_rss_mib"] > 50, (v, r)
    assert any(c == "N=12: mmpipe vs pillow on 4 rows: mean |pixel diff| up to 0.00 "
               "(tolerance 1.0), max 0" for c in summary["checks"])
    md = results[-1].with_suffix(".md").read_text()
    assert "| N | mmpipe img/s | vs" in md and "Checks: OK" in md
