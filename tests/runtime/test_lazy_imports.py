"""Lazy heavy imports (issue 13, item 5): an image-only job loads neither PyAV nor
pillow-heif nor transformers (nor torch) until a step needs them; HEIF still decodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import CASES, PHOTOS, REPO

HEAVY = ("av", "pillow_heif", "transformers", "sentence_transformers", "torch")

# What a PartitionWorker imports, then one image-only partition (3 bundled JPEGs) run
# through the assembled pipeline as the worker runs it, without Ray.
_IMAGE_JOB = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
import pipeline.runtime.worker  # the PartitionWorker's module and everything it imports
from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec

spec = JobSpec.model_validate({
    "source": {"kind": "manifest", "uri": sys.argv[1], "path_column": "file",
               "caption_column": "captions", "key_column": "key", "partition_size": 3},
    "sink": {"uri": sys.argv[2]},
    "resize": {"mode": "shorter_side", "size_px": 128, "encode_format": "jpeg"},
    "text_embedding": {"enabled": False}})
pool = ThreadPoolExecutor(2)
pipe = assemble(spec, {}, pool, setup=True)
part = next(planning.pack(pipe.datasource.list_inputs(), 3))
out = run_partition(pipe, part, "lazy", pool)
print(json.dumps({"rows": out.marker.rows_by_status,
                  "loaded": [m for m in sys.argv[3].split(",") if m in sys.modules]}))
"""

_HEIF = """
import json, sys
from pipeline.media.decode import decode_image
before = "pillow_heif" in sys.modules
img = decode_image(open(sys.argv[1], "rb").read())
print(json.dumps({"before": before, "after": "pillow_heif" in sys.modules,
                  "format": img.format, "shape": list(img.pixels.shape),
                  "size": [img.width, img.height]}))
"""


def _run(script: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_image_only_partition_loads_no_video_heif_or_model_library(tmp_path):
    got = _run(_IMAGE_JOB, str(PHOTOS / "captions.jsonl"), str(tmp_path / "out"),
               ",".join(HEAVY))
    assert got["rows"] == {"ok": 3, "rejected": 0, "error": 0}
    assert got["loaded"] == []


def test_a_heif_file_loads_pillow_heif_and_decodes():
    got = _run(_HEIF, str(CASES / "C44_heic" / "hopper.heif"))
    assert got["before"] is False and got["after"] is True
    assert got["format"] == "HEIF"
    assert got["shape"] == [got["size"][1], got["size"][0], 3] and min(got["size"]) > 0


def test_a_video_job_step_loads_pyav_at_setup():
    script = ("import json, sys\nfrom pipeline.spec import VideoSpec\n"
              "from pipeline.steps.video import VideoDecodeStep\n"
              "step = VideoDecodeStep(VideoSpec())\nbefore = 'av' in sys.modules\n"
              "step.setup()\nprint(json.dumps([before, 'av' in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True]
