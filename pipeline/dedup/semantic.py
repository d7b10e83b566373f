"""Semantic deduplication by embedding similarity (pure numpy + scikit-learn; no I/O, no Ray).

SemDeDup (Abbas et al. 2023, "SemDeDup: Data-efficient learning at web-scale through
semantic deduplication", arXiv:2303.09540): embed every record, cluster the embeddings
with spherical k-means, and within each cluster call two records duplicates when the
cosine similarity of their embeddings is at least ``threshold`` (the paper's ``1 - eps``).
Clustering makes the pairwise search cheap: only rows of one cluster are compared.

The dataset-wide pass never holds all embeddings in memory:

1. ``CentroidSample``: stream every embedding batch through ``add``; it keeps a uniform
   random sample of at most ``sample_size`` rows (reservoir sampling, Vitter's
   Algorithm R), memory ``O(sample_size * d)``.
2. ``fit_centroids(sample.sample(), clusters)``: spherical k-means on the sample
   (inputs L2-normalised, ``sklearn.cluster.KMeans``, centroids renormalised).
3. ``assign(batch, centroids)``: the nearest centroid (cosine) of each row, batch by batch;
   the caller routes rows to per-cluster buckets.
4. ``similar_pairs(cluster_embeddings, threshold)``: all pairs of one cluster at or above
   the threshold, computed block by block (``O(block_rows * n)`` extra memory).

Conventions. Embeddings are 2-D arrays ``(n, d)`` of a real numeric dtype (float16,
float32, float64 or integer; anything else is a ``TypeError``; a wrong number of
dimensions is a ``ValueError``). Cosine similarity is unitless, in ``[-1, 1]``. A row is
*finite* when all its values are finite; ``CentroidSample.add`` skips non-finite rows,
the other functions raise ``ValueError`` on them. A zero row has no direction: it is
dropped by ``fit_centroids``, matches nothing in ``similar_pairs`` and is assigned to
centroid 0 by ``assign`` (all its similarities are 0, a tie).
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["CentroidSample", "assign", "fit_centroids", "similar_pairs", "KMEANS_N_INIT"]

KMEANS_N_INIT = 3
"""``n_init`` of the ``sklearn.cluster.KMeans`` run in ``fit_centroids`` (fixed, so the
result depends only on the sample, ``clusters`` and ``seed``)."""

_RECHECK_PAIRS = 1 << 16   # float64 rechecks of similar_pairs, gathered this many at a time


# --------------------------------------------------------------------------- helpers


def _as_2d(emb, name: str) -> np.ndarray:
    """``emb`` as an ndarray of ndim 2 and a real numeric dtype (not copied)."""
    a = np.asarray(emb)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected a real numeric dtype (float/int), got {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array (n, d), got shape {a.shape}")
    return a


def _row_norms(a: np.ndarray, block_rows: int) -> np.ndarray:
    """L2 norms (float64, (n,)) of the rows of ``a``, in blocks (temporary float64 copies
    of at most ``block_rows`` rows). A row with a non-finite value has a non-finite norm."""
    n = a.shape[0]
    out = np.empty(n, np.float64)
    for s in range(0, n, block_rows):
        x = a[s:s + block_rows].astype(np.float64)
        out[s:s + block_rows] = np.sqrt(np.einsum("ij,ij->i", x, x))
    return out


def _check_block_rows(block_rows) -> int:
    if isinstance(block_rows, bool) or not isinstance(block_rows, numbers.Integral) or block_rows < 1:
        raise ValueError(f"block_rows must be an integer >= 1, got {block_rows!r}")
    return int(block_rows)


def _normalised(a: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Rows divided by their norms (zero rows stay zero), float32."""
    safe = np.where(norms > 0, norms, 1.0)
    return (a.astype(np.float64) / safe[:, None]).astype(np.float32)


# --------------------------------------------------------------------------- sampling


class CentroidSample:
    """Streamed, bounded-memory sample of embeddings for fitting k-means centroids.

    Reservoir sampling (Vitter 1985, "Random sampling with a reservoir", Algorithm R),
    vectorised per ``add`` call: after ``seen`` finite rows, the reservoir holds a uniform
    random subset of ``min(seen, sample_size)`` of them, each row included with
    probability ``sample_size / seen``. Memory is ``O(sample_size * d)`` float32 (grown as
    rows arrive, never above ``sample_size`` rows) plus the caller's batch, whatever the
    total number of rows.

    Deterministic: the sample depends only on ``seed`` and the sequence of finite rows, not
    on how the rows are split across ``add`` calls (row ``t >= sample_size`` consumes
    exactly one float64 draw of ``numpy.random.default_rng(seed).random``).

    Args:
        sample_size: the most rows kept (int >= 1; else ``ValueError``).
        seed: seed of ``numpy.random.default_rng`` (a non-negative int).
    """

    def __init__(self, sample_size: int, seed: int = 0):
        if isinstance(sample_size, bool) or not isinstance(sample_size, numbers.Integral) or sample_size < 1:
            raise ValueError(f"sample_size must be an integer >= 1, got {sample_size!r}")
        self._k = int(sample_size)
        self._rng = np.random.default_rng(seed)
        self._d: int | None = None
        self._buf = np.zeros((0, 0), np.float32)   # capacity rows; the first _filled are used
        self._filled = 0
        self._seen = 0
        self._skipped = 0

    @property
    def sample_size(self) -> int:
        """The most rows kept."""
        return self._k

    @property
    def seen(self) -> int:
        """Rows offered so far that took part in the sampling (finite rows; non-finite
        rows are counted in ``skipped`` instead)."""
        return self._seen

    @property
    def skipped(self) -> int:
        """Rows offered so far that were skipped because they held a non-finite value."""
        return self._skipped

    def _reserve(self, rows: int) -> None:
        cap = self._buf.shape[0]
        if rows <= cap:
            return
        new_cap = min(self._k, max(rows, 2 * cap, 16))
        buf = np.empty((new_cap, self._d), np.float32)
        buf[:self._filled] = self._buf[:self._filled]
        self._buf = buf

    def add(self, emb: np.ndarray) -> None:
        """Offer a batch of embeddings.

        Args:
            emb: ``(n, d)`` array, float32 or float16 (any real numeric dtype is accepted
                and stored as float32); ``n`` may be 0. Rows holding NaN or +-inf are
                skipped (counted in ``skipped``).

        Raises:
            TypeError: a non-numeric dtype.
            ValueError: ``emb`` is not 2-D, or its ``d`` differs from an earlier call's
                (the sample is left unchanged).
        """
        a = _as_2d(emb, "emb")
        d = a.shape[1]
        if self._d is None:
            self._d = d
            self._buf = np.empty((0, d), np.float32)
        elif d != self._d:
            raise ValueError(f"emb: embedding dimension changed from {self._d} to {d}")
        if a.shape[0] == 0:
            return
        finite = np.isfinite(_row_norms(a, 8192))
        if not finite.all():
            self._skipped += int(np.count_nonzero(~finite))
            a = a[finite]
        n = a.shape[0]
        if n == 0:
            return
        k, t0 = self._k, self._seen
        # Fill phase: rows t < k go to slot t.
        fill = max(0, min(n, k - t0))
        if fill:
            self._reserve(t0 + fill)
            self._buf[t0:t0 + fill] = a[:fill]
            self._filled = t0 + fill
        # Replacement phase: row t >= k draws j uniform in [0, t]; if j < k it replaces
        # slot j. Later rows of the batch win over earlier ones for the same slot, as in
        # the sequential algorithm.
        rest = n - fill
        if rest:
            t = np.arange(t0 + fill, t0 + n, dtype=np.float64)
            j = np.floor(self._rng.random(rest) * (t + 1.0))
            j = np.minimum(j, t).astype(np.int64)
            hit = np.flatnonzero(j < k)
            if hit.size:
                slots = j[hit]
                # last occurrence of each slot in batch order
                rev_slots = slots[::-1]
                uniq, first_in_rev = np.unique(rev_slots, return_index=True)
                src = hit[::-1][first_in_rev]
                self._buf[uniq] = a[fill + src]
        self._seen = t0 + n

    def sample(self) -> np.ndarray:
        """The current sample: a new ``(min(seen, sample_size), d)`` float32 array, rows in
        reservoir-slot order. Before any ``add`` it is ``(0, 0)``."""
        if self._d is None:
            return np.zeros((0, 0), np.float32)
        return self._buf[:self._filled].copy()


# --------------------------------------------------------------------------- clustering


def fit_centroids(sample: np.ndarray, clusters: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means centroids of a sample, as in SemDeDup (arXiv:2303.09540, sec. 3).

    The sample rows are L2-normalised (zero rows dropped), clustered with
    ``sklearn.cluster.KMeans(n_clusters=k, init="k-means++", n_init=KMEANS_N_INIT,
    random_state=seed)`` (Euclidean k-means on unit vectors; see the scikit-learn user
    guide, "Clustering > K-means"), and the resulting centroids renormalised to unit
    length. ``k = min(clusters, number of distinct normalised rows)`` (at least 1), so a
    sample with fewer distinct directions than ``clusters`` gives fewer centroids instead
    of duplicates. Deterministic for a given sample, ``clusters`` and ``seed``.

    Args:
        sample: ``(n, d)`` embeddings (e.g. ``CentroidSample.sample()``), any real dtype.
        clusters: the number of clusters wanted (int >= 1).
        seed: ``random_state`` of ``KMeans``.

    Returns:
        ``(k, d)`` float32 centroids, each row of unit L2 norm.

    Raises:
        TypeError: a non-numeric dtype.
        ValueError: ``sample`` not 2-D, ``d == 0``, empty (``n == 0``) or all rows zero,
            any non-finite value, or ``clusters < 1``.
    """
    from sklearn.cluster import KMeans

    a = _as_2d(sample, "sample")
    if isinstance(clusters, bool) or not isinstance(clusters, numbers.Integral) or clusters < 1:
        raise ValueError(f"clusters must be an integer >= 1, got {clusters!r}")
    if a.shape[0] == 0:
        raise ValueError("sample is empty: no rows to fit centroids on")
    if a.shape[1] == 0:
        raise ValueError("sample has d == 0")
    norms = _row_norms(a, 8192)
    if not np.isfinite(norms).all():
        raise ValueError("sample holds non-finite values")
    keep = norms > 0
    if not keep.any():
        raise ValueError("sample has only zero rows: no direction to cluster")
    x = _normalised(a[keep], norms[keep])
    distinct = np.unique(x, axis=0).shape[0]
    k = max(1, min(int(clusters), distinct))
    km = KMeans(n_clusters=k, init="k-means++", n_init=KMEANS_N_INIT, random_state=seed)
    labels = km.fit_predict(x)
    c = km.cluster_centers_.astype(np.float64)
    cn = np.linalg.norm(c, axis=1)
    for i in np.flatnonzero(cn == 0):   # members cancel out (e.g. antipodal rows)
        c[i] = x[np.flatnonzero(labels == i)[0]]
        cn[i] = np.linalg.norm(c[i])
    return (c / cn[:, None]).astype(np.float32)


def assign(emb: np.ndarray, centroids: np.ndarray, block_rows: int = 8192) -> np.ndarray:
    """Index of the nearest centroid of each row by cosine similarity.

    Rows and centroids are L2-normalised, similarities computed in float64 ``block_rows``
    rows at a time (extra memory ``O(block_rows * (k + d))``) and the arg-max taken; ties
    go to the lowest centroid index (``numpy.argmax``), so a zero row gets 0.

    Args:
        emb: ``(n, d)`` embeddings, any real dtype; ``n`` may be 0.
        centroids: ``(k, d)`` centroids (``fit_centroids``), ``k >= 1``.
        block_rows: rows per block (int >= 1).

    Returns:
        ``(n,)`` int32 centroid indices in ``[0, k)``.

    Raises:
        TypeError: a non-numeric dtype.
        ValueError: not 2-D, ``d`` differs, ``k == 0``, non-finite values in ``emb`` or
            ``centroids``, or ``block_rows < 1``.
    """
    block_rows = _check_block_rows(block_rows)
    a = _as_2d(emb, "emb")
    c = _as_2d(centroids, "centroids")
    if c.shape[0] == 0:
        raise ValueError("centroids is empty (k == 0)")
    if a.shape[1] != c.shape[1]:
        raise ValueError(f"dimension mismatch: emb d={a.shape[1]}, centroids d={c.shape[1]}")
    c = c.astype(np.float64)
    cn = np.linalg.norm(c, axis=1)
    if not np.isfinite(cn).all():
        raise ValueError("centroids hold non-finite values")
    ct = (c / np.where(cn > 0, cn, 1.0)[:, None]).T   # (d, k)
    n = a.shape[0]
    out = np.empty(n, np.int32)
    for s in range(0, n, block_rows):
        x = a[s:s + block_rows].astype(np.float64)
        xn = np.sqrt(np.einsum("ij,ij->i", x, x))
        if not np.isfinite(xn).all():
            raise ValueError(f"emb holds non-finite values (rows {s}..{s + len(x) - 1})")
        x /= np.where(xn > 0, xn, 1.0)[:, None]
        out[s:s + len(x)] = np.argmax(x @ ct, axis=1)
    return out


# --------------------------------------------------------------------------- pairs


def similar_pairs(emb: np.ndarray, threshold: float, block_rows: int = 2048) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs of rows whose cosine similarity is at least ``threshold``.

    SemDeDup's within-cluster step (arXiv:2303.09540, sec. 3: pairs with cosine similarity
    ``>= 1 - eps`` are semantic duplicates). Rows are L2-normalised to float32; zero rows
    match nothing. The similarity matrix is computed ``block_rows`` rows at a time against
    the rows after the block (upper triangle only: ``block_rows x n`` float32 matmuls), so
    the extra memory peaks at ``O(block_rows * n)`` floats plus the normalised copy of
    ``emb`` (``n * d`` float32) and the result - never ``n * n`` for ``n > block_rows``.

    Exactness: float32 products are within ``(d + 4) * 2**-23`` of the true cosine
    (Higham's bound for a dot product of unit vectors), so a pair whose float32 value is
    that close to ``threshold`` is decided again from the original rows in float64. The
    decision is ``cos >= threshold - (d + 4) * 2**-52`` in float64 (the slack only absorbs
    float64 rounding, so rows pointing the same way, e.g. exact duplicates, are found at
    ``threshold == 1``).

    Args:
        emb: ``(n, d)`` embeddings, any real dtype; ``n`` may be 0 or 1 (no pairs).
        threshold: the minimum cosine similarity, unitless, in ``(0, 1]``.
        block_rows: rows per block (int >= 1).

    Returns:
        ``(i, j, similarity)``: ``i`` int64 ``(m,)``, ``j`` int64 ``(m,)`` with
        ``i < j``, and ``similarity`` float32 ``(m,)`` (at most 1), sorted by ``(i, j)``.

    Raises:
        TypeError: a non-numeric dtype.
        ValueError: ``emb`` not 2-D, non-finite values in ``emb``, ``threshold`` not a
            real number in ``(0, 1]``, or ``block_rows < 1``.
    """
    block_rows = _check_block_rows(block_rows)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise ValueError(f"threshold must be a real number in (0, 1], got {threshold!r}")
    thr = float(threshold)
    if not (0.0 < thr <= 1.0):   # also rejects NaN
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    a = _as_2d(emb, "emb")
    n, d = a.shape
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    norms = _row_norms(a, block_rows)
    if not np.isfinite(norms).all():
        raise ValueError("emb holds non-finite values")
    if n < 2 or d == 0:
        return empty
    idx = np.flatnonzero(norms > 0)           # original index of each usable row (sorted)
    nv = idx.size
    if nv < 2:
        return empty
    u = np.empty((nv, d), np.float32)
    for s in range(0, nv, block_rows):
        rows = idx[s:s + block_rows]
        u[s:s + len(rows)] = a[rows].astype(np.float64) / norms[rows, None]
    band = (d + 4) * 2.0**-23
    slack64 = (d + 4) * 2.0**-52
    lo = np.float32(thr - band)
    hi = np.float32(thr + band)
    out_i, out_j, out_s = [], [], []
    for s in range(0, nv - 1, block_rows):
        e = min(s + block_rows, nv)
        sim = u[s:e] @ u[s:].T                 # (b, nv - s) float32
        b = e - s
        sim[:, :b][np.tril(np.ones((b, b), dtype=bool))] = -np.inf   # j <= i
        r, c = np.nonzero(sim >= lo)           # row-major: sorted by (r, c)
        if r.size == 0:
            continue
        vals = sim[r, c]
        del sim
        gi = r + s                             # positions in idx
        gj = c + s
        unsure = np.flatnonzero(vals < hi)
        keep = np.ones(r.size, dtype=bool)
        for q in range(0, unsure.size, _RECHECK_PAIRS):
            sel = unsure[q:q + _RECHECK_PAIRS]
            oi, oj = idx[gi[sel]], idx[gj[sel]]
            xi = a[oi].astype(np.float64)
            xj = a[oj].astype(np.float64)
            cos = np.einsum("ij,ij->i", xi, xj) / (norms[oi] * norms[oj])
            keep[sel] = cos >= thr - slack64
            vals[sel] = np.minimum(cos, 1.0)
        out_i.append(idx[gi[keep]])
        out_j.append(idx[gj[keep]])
        out_s.append(np.minimum(vals[keep], np.float32(1.0)).astype(np.float32))
    if not out_i:
        return empty
    return (
        np.concatenate(out_i).astype(np.int64),
        np.concatenate(out_j).astype(np.int64),
        np.concatenate(out_s).astype(np.float32),
    )
