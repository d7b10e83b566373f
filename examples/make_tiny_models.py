#!/usr/bin/env python
"""Build small random-initialised checkpoints of real architectures for the examples.

    .venv/bin/python examples/make_tiny_models.py                 # -> output/tiny-models/
    .venv/bin/python examples/make_tiny_models.py --out DIR --only tiny-clip,tiny-blip

CLIP, SigLIP, BLIP, LLaVA, ConvNeXt and the two LAION heads. Real architectures
(transformers config classes), real processors and tokenizers, tiny
widths, random weights: the pipeline runs exactly as with real weights, but embeddings,
scores and captions are junk. See ``pipeline/testing/tiny_models.py``. Offline; ~10 s on a laptop.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.testing.tiny_models import NAMES, build_tiny_models  # noqa: E402


class _DefaultConfigWarning(logging.Filter):
    """Drops transformers' "Model config: bos_token_id must be ... within the vocabulary"
    warning. Its cause is not these models: ``save_pretrained`` diffs each config against a
    default-constructed one, and transformers' default ``SiglipTextConfig`` has
    bos/eos ids (49406/49407) outside its own default 32000-token vocabulary. The saved
    configs' ids are within their vocabularies."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "must be `None` or an integer within the vocabulary" not in record.getMessage()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "output" / "tiny-models"),
                        help="directory to build into (default: output/tiny-models)")
    parser.add_argument("--only", default=",".join(NAMES), help="comma-separated subset")
    parser.add_argument("--full-size", action="store_true",
                        help="real widths/depths (CLIP ViT-B/32, SigLIP base, BLIP base), "
                        "random weights: for GPU throughput checks without real weights")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()          # no "Writing model shards" bar per model
    logging.getLogger("transformers.configuration_utils").addFilter(_DefaultConfigWarning())
    names = tuple(n for n in args.only.split(",") if n)
    for name, path in build_tiny_models(args.out, names, full_size=args.full_size).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
