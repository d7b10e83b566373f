#!/usr/bin/env python
"""What the quality heads cost: image-embedding time with vs without the two LAION heads
(``laion-aesthetic``, ``laion-nsfw``) and one zero-shot classifier (issue 26; goal: the
heads add at most 5%).

How: a CLIP checkpoint of the real ViT-B/32 widths and depths with projection_dim 768
(``tiny_models.build_clip(full_size=True, projection_dim=768)``, random weights; the
LAION heads take 768-d embeddings) and head weights of the published layouts (random) are
written to ``--workdir`` once. Two backends are loaded in this process through the normal
path (``registry.load_backend``): ``plain`` (image embedding only) and ``heads`` (the same
model plus both heads and a three-prompt zero-shot classifier). The bundled photos
(data/photos, decoded and cropped once, outside the timing) are embedded in batches of
``--batch`` rows by each backend in turn, ``--repeats`` times interleaved (plain, heads,
plain, heads, ...), after one warm-up pass each; the medians of the passes are compared.
``score: false`` for both: the caption tower is not part of the comparison.

Printed: one line per backend (median seconds per pass, images/s) and as the last line
``quality_heads: plain_s=<s> heads_s=<s> ratio=<heads/plain> goal=<=1.05``.

    .venv/bin/python bench/quality_heads.py                    # CPU
    .venv/bin/python bench/quality_heads.py --device cuda --repeats 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PROMPTS = ["a photo with a watermark", "a photo without a watermark", "a drawing"]


def prepare(workdir: Path) -> tuple[str, dict[str, str]]:
    """The CLIP checkpoint directory and the head weight files (built once)."""
    import torch
    from safetensors.torch import save_file

    from pipeline.models.heads import build_module
    from pipeline.spec import HeadSpec
    from pipeline.testing.tiny_models import build_clip

    model = workdir / "clip-b32-768"
    if not (model / "config.json").is_file():
        torch.manual_seed(0)
        build_clip(model, full_size=True, projection_dim=768)
    files = {"laion-aesthetic": workdir / "aesthetic.pth",
             "laion-nsfw": workdir / "nsfw.safetensors"}
    if not all(f.is_file() for f in files.values()):
        torch.manual_seed(1)
        torch.save(build_module(HeadSpec(preset="laion-aesthetic", weights="w")).state_dict(),
                   files["laion-aesthetic"])
        save_file(build_module(HeadSpec(preset="laion-nsfw", weights="w")).state_dict(),
                  str(files["laion-nsfw"]))
    return str(model), {k: str(v) for k, v in files.items()}


def backends(model: str, files: dict[str, str], device: str, batch: int):
    from pipeline.models.registry import load_backend
    from pipeline.spec import JobSpec

    def spec(**extra):
        return JobSpec.model_validate({
            "source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"},
            "text_embedding": {"enabled": False},
            "image_embedding": {"enabled": True, "model": model, "score": False,
                                "batch_size": batch, **extra}})
    heads = {"heads": [{"preset": p, "weights": w} for p, w in files.items()],
             "zero_shot": [{"name": "watermark", "labels": PROMPTS}]}
    return (load_backend("image_embedding", spec(), device),
            load_backend("image_embedding", spec(**heads), device))


def photos(geometry):
    import numpy as np
    from PIL import Image

    from pipeline.media.geometry import model_input

    rows = [json.loads(line) for line in
            (REPO / "data" / "photos" / "captions.jsonl").read_text().splitlines() if line]
    return np.stack([model_input(np.asarray(Image.open(REPO / "data" / "photos" / r["file"])
                                            .convert("RGB")), geometry) for r in rows])


def one_pass(backend, pixels, batch: int, device: str) -> float:
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(pixels), batch):
            backend.run(backend.prepare({"pixels": pixels[i:i + batch]}))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/mmpipe-bench-quality-heads"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model, files = prepare(args.workdir)
    plain, heads = backends(model, files, args.device, args.batch)
    pixels = photos(plain.info.image)
    print(f"{len(pixels)} photos, batch {args.batch}, {args.repeats} interleaved repeats, "
          f"{plain.info.description}; heads: {[f.name for f in heads.info.outputs[1:]]}")
    times = {"plain": [], "heads": []}
    for b in (plain, heads):
        one_pass(b, pixels, args.batch, args.device)              # warm-up
    for _ in range(args.repeats):
        for name, b in (("plain", plain), ("heads", heads)):
            times[name].append(one_pass(b, pixels, args.batch, args.device))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"  {k:6s} median {med[k]:.4f} s/pass ({len(pixels) / med[k]:.1f} images/s), "
              f"passes {[round(t, 4) for t in v]}")
    print(f"quality_heads: plain_s={med['plain']:.4f} heads_s={med['heads']:.4f} "
          f"ratio={med['heads'] / med['plain']:.4f} goal=<=1.05")
    return 0


if __name__ == "__main__":
    sys.exit(main())
