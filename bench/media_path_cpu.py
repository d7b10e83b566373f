#!/usr/bin/env python
"""Worker CPU per image, images decoded on the worker (``decode.device: cpu``) versus sent
encoded to the model actor (``cuda``), issue 13 item 3's CPU side.

    .venv/bin/python bench/media_path_cpu.py                 # 57 bundled photos x 8, 1 thread
    .venv/bin/python bench/media_path_cpu.py --repeat 20

What it measures: the CPU steps a PartitionWorker runs for a CLIP ViT-B/32 embedding job
(``assemble(spec)`` with the model bound to a ``ModelInfo`` of CLIP's geometry, 224 px
centre crop; no model is called): captions, decode, filters, sha256 + pHash, dedup off,
the model input, resize to 256 px + JPEG re-encode, then the pickling of the model
request (what ``ray.put`` serialises: the (n, 224, 224, 3) uint8 array, or the list of
``JpegInput``/``HostDecoded`` entries). The input: every JPEG photo in data/photos (640 px
COCO photos) repeated ``--repeat`` times, in batches of 32, on one thread
(``time.process_time``), the two paths interleaved batch by batch so that drifting load
hits both. With ``cuda`` the decode of a JPEG sent encoded, its model input and its output
image happen in the actor (on the GPU), so they are not in its worker cost.

Printed: ms of worker CPU per image for each path, their ratio, and how many worker cores
feed 4,900 img/s (the issue's goal for one H200: 0.9 x CLIP ViT-B/32 alone). Last line:
``media_path_cpu: cpu_ms=<a> cuda_ms=<b> ratio=<a/b>``.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.assembly import assemble  # noqa: E402
from pipeline.columns import KEY, RAW_CAPTION, SOURCE_BYTES, SOURCE_URI, STATUS  # noqa: E402
from pipeline.contracts import ImageGeometry, ModelInfo, OutputField
from pipeline.spec import JobSpec  # noqa: E402

CLIP = ModelInfo("clip", (OutputField("image_embedding", "vector", 512),),
                 image=ImageGeometry("center_crop", 224, 224, 224, 3), text=None)
GOAL_IMG_PER_S = 4900


def pipeline_for(device: str):
    spec = JobSpec.model_validate({
        "name": f"media-{device}", "source": {"kind": "files", "uri": str(REPO / "data/photos")},
        "sink": {"uri": "/tmp/unused"}, "decode": {"device": device},
        "dedup": {"exact": False, "near": False}, "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": "unused", "score": False}})
    pipe = assemble(spec, {"image_embedding": (None, CLIP)})
    return pipe.steps, pipe.models.stages[0][0]


def batches(paths: list[Path], repeat: int, size: int):
    data = [(p, p.read_bytes()) for p in paths] * repeat
    for start in range(0, len(data), size):
        chunk = data[start:start + size]
        yield {KEY: [f"{p.stem}-{start + i}" for i, (p, _) in enumerate(chunk)],
               SOURCE_URI: [p.as_uri() for p, _ in chunk], SOURCE_BYTES: [b for _, b in chunk],
               RAW_CAPTION: [None] * len(chunk), STATUS: ["ok"] * len(chunk)}


def run(steps, model_step, batch) -> float:
    t0 = time.process_time()
    for step in steps:
        batch = step(batch)
    ok = [i for i, s in enumerate(batch[STATUS]) if s == "ok"]
    pickle.dumps(model_step.inputs(batch, ok), protocol=5)
    return time.process_time() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    paths = sorted((REPO / "data/photos").glob("*.jpg"))
    paths_ = {d: pipeline_for(d) for d in ("cpu", "cuda")}
    for d in paths_:                              # warm-up: imports, caches
        run(*paths_[d], next(batches(paths, 1, args.batch)))
    cost = {"cpu": 0.0, "cuda": 0.0}
    n = 0
    for batch in batches(paths, args.repeat, args.batch):
        for d in ("cpu", "cuda"):
            cost[d] += run(*paths_[d], {k: list(v) for k, v in batch.items()})
        n += len(batch[KEY])
    ms = {d: 1000 * c / n for d, c in cost.items()}
    print(f"media_path_cpu: {n} images ({len(paths)} photos x {args.repeat}), one thread")
    for d in ("cpu", "cuda"):
        print(f"  decode.device {d}: {ms[d]:.2f} ms CPU per image = {1000 / ms[d]:.0f} img/s "
              f"per core; {GOAL_IMG_PER_S * ms[d] / 1000:.1f} worker cores for "
              f"{GOAL_IMG_PER_S} img/s")
    print(f"media_path_cpu: cpu_ms={ms['cpu']:.2f} cuda_ms={ms['cuda']:.2f} "
          f"ratio={ms['cpu'] / ms['cuda']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
