"""pipeline.dedup.semantic: reservoir sample, spherical k-means, assignment, blocked pairs."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from pipeline.dedup.semantic import CentroidSample, assign, fit_centroids, similar_pairs


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def _chunks(a: np.ndarray, sizes) -> list[np.ndarray]:
    out, s = [], 0
    for k in itertools.cycle(sizes):
        if s >= len(a):
            return out
        out.append(a[s:s + k])
        s += k


# --------------------------------------------------------------------------- CentroidSample


def test_sample_fill_phase_keeps_everything_in_order():
    cs = CentroidSample(10, seed=1)
    assert cs.sample().shape == (0, 0) and cs.seen == 0
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    cs.add(x[:3])
    cs.add(x[3:])
    assert cs.seen == 7
    np.testing.assert_array_equal(cs.sample(), x)
    assert cs.sample().dtype == np.float32


def test_sample_size_bound_and_members():
    n, k = 5000, 64
    x = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    cs = CentroidSample(k, seed=3)
    for part in _chunks(x, [1, 7, 300, 1000]):
        cs.add(part)
        assert cs.sample().shape == (min(cs.seen, k), 3)
    s = cs.sample()
    assert cs.seen == n and s.shape == (k, 3)
    assert cs._buf.shape[0] <= k                        # storage never above sample_size rows
    ids = s[:, 0].astype(np.int64)
    assert len(set(ids.tolist())) == k                  # sampled without replacement
    np.testing.assert_array_equal(s, ids[:, None].astype(np.float32) * np.ones((1, 3)))


def test_sample_deterministic_and_chunking_invariant():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 8)).astype(np.float16)

    def run(seed, sizes):
        cs = CentroidSample(100, seed=seed)
        for part in _chunks(x, sizes):
            cs.add(part)
        return cs.sample()

    a = run(7, [3000])
    np.testing.assert_array_equal(a, run(7, [3000]))
    np.testing.assert_array_equal(a, run(7, [1, 99, 250, 13]))   # same rows, other batches
    assert not np.array_equal(a, run(8, [3000]))
    assert a.dtype == np.float32


def test_sample_uniform_mean_and_deciles():
    # N = 100000 rows 0..N-1, sample 2000: the sample mean has sd ~ N/sqrt(12*2000) ~ 645;
    # tolerance 3000 (~4.6 sd). Each decile holds Binomial-like ~200 (sd ~13.4), +-60 (~4.5 sd).
    n, k = 100_000, 2000
    x = np.arange(n, dtype=np.float32)[:, None]
    cs = CentroidSample(k, seed=11)
    for part in _chunks(x, [4096, 17, 999]):
        cs.add(part)
    v = cs.sample()[:, 0]
    assert v.shape == (k,)
    assert abs(v.mean() - (n - 1) / 2) < 3000
    counts = np.bincount((v // (n // 10)).astype(np.int64), minlength=10)
    assert counts.sum() == k
    assert np.all(np.abs(counts - k / 10) < 60), counts


def test_sample_inclusion_probability_algorithm_r():
    # N=20, k=5 over 2000 seeds: each row included with p = 0.25 -> 500 +- 19.4 (sd); +-90.
    n, k, reps = 20, 5, 2000
    x = np.arange(n, dtype=np.float32)[:, None]
    hits = np.zeros(n, np.int64)
    for seed in range(reps):
        cs = CentroidSample(k, seed=seed)
        cs.add(x[:8])
        cs.add(x[8:])
        hits[cs.sample()[:, 0].astype(np.int64)] += 1
    assert hits.sum() == k * reps
    assert np.all(np.abs(hits - reps * k / n) < 90), hits


def test_sample_skips_non_finite_rows():
    cs = CentroidSample(100, seed=0)
    x = np.array([[1, 2], [np.nan, 0], [3, np.inf], [4, 5], [-np.inf, 1]], np.float32)
    cs.add(x)
    assert cs.seen == 2 and cs.skipped == 3
    np.testing.assert_array_equal(cs.sample(), np.array([[1, 2], [4, 5]], np.float32))


def test_sample_dimension_change_and_bad_args():
    cs = CentroidSample(4)
    cs.add(np.zeros((0, 3), np.float32))   # an empty batch fixes d too
    cs.add(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="dimension"):
        cs.add(np.ones((2, 4), np.float32))
    assert cs.seen == 2 and cs.sample().shape == (2, 3)   # unchanged
    with pytest.raises(ValueError):
        cs.add(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        cs.add(np.array([["a", "b", "c"]]))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError):
            CentroidSample(bad)


# --------------------------------------------------------------------------- fit_centroids


def _blobs(seed=0, per=100, d=16):
    rng = np.random.default_rng(seed)
    dirs = np.eye(d)[:3] * 10.0                       # orthogonal, well-separated directions
    labels = np.repeat(np.arange(3), per)
    x = dirs[labels] + rng.normal(scale=0.5, size=(3 * per, d))
    perm = rng.permutation(len(x))
    return x[perm].astype(np.float32), labels[perm], np.eye(d)[:3]


def test_fit_centroids_recovers_three_blobs():
    x, labels, true_dirs = _blobs()
    c = fit_centroids(x, 3, seed=0)
    assert c.shape == (3, 16) and c.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-6)
    got = assign(x, c)
    # one-to-one mapping between found clusters and blob labels, no row misassigned
    mapping = {int(g): int(lab) for g, lab in zip(got, labels)}
    assert sorted(mapping.values()) == [0, 1, 2] and len(mapping) == 3
    assert all(mapping[int(g)] == int(lab) for g, lab in zip(got, labels))
    # each centroid points at its blob's direction
    for g, lab in mapping.items():
        assert float(c[g] @ true_dirs[lab]) > 0.99


def test_fit_centroids_deterministic():
    x, _, _ = _blobs(seed=5)
    a = fit_centroids(x, 5, seed=2)
    np.testing.assert_array_equal(a, fit_centroids(x, 5, seed=2))
    np.testing.assert_array_equal(a, fit_centroids(x.copy(), 5, seed=2))


def test_fit_centroids_more_clusters_than_distinct_rows():
    base = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 0]], np.float32)
    x = np.concatenate([base, base * 2, base, np.zeros((3, 3), np.float32)])   # 4 directions
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # no sklearn ConvergenceWarning
        c = fit_centroids(x, 10, seed=0)
    assert c.shape == (4, 3)
    want = _unit(base)
    # the centroids are exactly the 4 directions (in some order)
    sims = c.astype(np.float64) @ want.T
    np.testing.assert_allclose(np.sort(sims.max(axis=1)), 1.0, atol=1e-6)
    assert sorted(np.argmax(sims, axis=1).tolist()) == [0, 1, 2, 3]
    one = fit_centroids(np.array([[3.0, 4.0]] * 5), 4)
    np.testing.assert_allclose(one, [[0.6, 0.8]], atol=1e-7)


def test_fit_centroids_errors():
    with pytest.raises(ValueError, match="empty"):
        fit_centroids(np.zeros((0, 4), np.float32), 3)
    with pytest.raises(ValueError):
        fit_centroids(np.zeros((5, 4), np.float32), 3)   # only zero rows
    with pytest.raises(ValueError):
        fit_centroids(np.ones((5, 4), np.float32), 0)
    with pytest.raises(ValueError):
        fit_centroids(np.array([[1.0, np.nan]]), 1)
    with pytest.raises(ValueError):
        fit_centroids(np.ones(4, np.float32), 1)


# --------------------------------------------------------------------------- assign


def test_assign_matches_brute_force():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(1000, 24)) * rng.uniform(0.1, 50, size=(1000, 1))).astype(np.float32)
    x[5] = 0.0
    c = _unit(rng.normal(size=(37, 24))).astype(np.float32)
    brute = np.argmax(_unit(x) @ _unit(c).T, axis=1)
    for block in (1, 7, 128, 8192):
        got = assign(x, c, block_rows=block)
        assert got.dtype == np.int32 and got.shape == (1000,)
        np.testing.assert_array_equal(got, brute)
    assert assign(x, c)[5] == 0                          # zero row: all ties -> 0
    # float16 input, un-normalised centroids: same answer
    np.testing.assert_array_equal(assign(x.astype(np.float16), c * 3.0, block_rows=64),
                                  np.argmax(_unit(x.astype(np.float16)) @ c.T.astype(np.float64), axis=1))


def test_assign_ties_lowest_index_and_edges():
    c = np.array([[1, 0], [0, 1], [1, 0]], np.float32)
    x = np.array([[1, 1], [1, 0], [0, 5], [-1, -1]], np.float32)
    np.testing.assert_array_equal(assign(x, c, block_rows=3), [0, 0, 1, 0])
    assert assign(np.zeros((0, 2), np.float32), c).shape == (0,)
    with pytest.raises(ValueError):
        assign(x, np.zeros((0, 2), np.float32))
    with pytest.raises(ValueError):
        assign(x, np.ones((2, 3), np.float32))
    with pytest.raises(ValueError):
        assign(np.array([[np.inf, 0]], np.float32), c)
    with pytest.raises(ValueError):
        assign(x, c, block_rows=0)


# --------------------------------------------------------------------------- similar_pairs


def _brute_pairs(x: np.ndarray, thr: float):
    u = _unit(x)
    s = u @ u.T
    d = x.shape[1]
    i, j = np.nonzero(np.triu(s >= thr - (d + 4) * 2.0**-52, k=1))
    zero = np.linalg.norm(np.asarray(x, np.float64), axis=1) == 0
    ok = ~zero[i] & ~zero[j]
    return i[ok], j[ok], s[i[ok], j[ok]]


def _planted(seed=0, n=300, d=32):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    src = rng.choice(n, size=40, replace=False)
    dst = rng.choice(np.setdiff1d(np.arange(n), src), size=40, replace=False)
    x[dst[:10]] = x[src[:10]]                                   # exact duplicates
    x[dst[10:15]] = x[src[10:15]] * 2.0                         # same direction, scaled exactly
    noise = rng.normal(size=(25, d)).astype(np.float32)
    scales = np.repeat([0.01, 0.05, 0.2, 0.5, 1.0], 5)[:, None].astype(np.float32)
    x[dst[15:]] = x[src[15:]] + scales * noise                  # near duplicates, graded
    x[[3, 77]] = 0.0                                            # zero rows
    return x


@pytest.mark.parametrize("thr", [1.0, 0.999, 0.99, 0.95, 0.8, 0.5, 0.3, 1e-6])
def test_similar_pairs_match_brute_force(thr):
    x = _planted()
    bi, bj, bs = _brute_pairs(x, thr)
    for block in (1, 17, 64, 2048):
        i, j, s = similar_pairs(x, thr, block_rows=block)
        assert i.dtype == np.int64 and j.dtype == np.int64 and s.dtype == np.float32
        np.testing.assert_array_equal(i, bi)           # same set, sorted by (i, j)
        np.testing.assert_array_equal(j, bj)
        np.testing.assert_allclose(s, np.minimum(bs, 1.0), atol=1e-5)
        assert np.all(i < j) and np.all(s <= 1.0)
        assert not np.isin([3, 77], np.r_[i, j]).any()  # zero rows match nothing
    if thr == 1.0:
        assert len(bi) == 15                           # the planted exact + scaled copies
        np.testing.assert_array_equal(similar_pairs(x, 1.0)[2], np.ones(15, np.float32))
    if thr == 1e-6:
        assert len(bi) > 10000                         # about half of all 44551 pairs


def test_similar_pairs_threshold_exactly_at_a_pair():
    x = _planted(seed=4, n=100, d=8)
    i, j, _ = _brute_pairs(x, 0.7)
    a, b = int(i[0]), int(j[0])
    xa, xb = x[a].astype(np.float64), x[b].astype(np.float64)
    cos = float(xa @ xb / (np.linalg.norm(xa) * np.linalg.norm(xb)))
    pi, pj, _ = similar_pairs(x, cos, block_rows=5)
    assert (a, b) in set(zip(pi.tolist(), pj.tolist()))
    pi, pj, _ = similar_pairs(x, min(1.0, cos + 1e-9), block_rows=5)
    assert (a, b) not in set(zip(pi.tolist(), pj.tolist()))


def test_similar_pairs_small_and_edge_inputs():
    for n in (0, 1):
        i, j, s = similar_pairs(np.ones((n, 4), np.float32), 0.5, block_rows=2)
        assert i.shape == j.shape == s.shape == (0,)
        assert (i.dtype, j.dtype, s.dtype) == (np.int64, np.int64, np.float32)
    i, j, s = similar_pairs(np.zeros((5, 3), np.float16), 1e-9, block_rows=2)   # all zero rows
    assert len(i) == 0
    x = np.array([[1, 0], [0, 0], [2, 0], [0, 1], [-1, 0]], np.float16)
    i, j, s = similar_pairs(x, 1.0, block_rows=2)
    assert list(zip(i.tolist(), j.tolist())) == [(0, 2)] and s.tolist() == [1.0]
    i, j, s = similar_pairs(x, 1e-6, block_rows=1)
    assert list(zip(i.tolist(), j.tolist())) == [(0, 2)]   # orthogonal/opposite rows excluded


def test_similar_pairs_errors():
    x = np.ones((3, 2), np.float32)
    for bad in (0.0, -0.1, 1.0000001, float("nan"), float("inf"), "0.5", None):
        with pytest.raises(ValueError):
            similar_pairs(x, bad)
    with pytest.raises(ValueError):
        similar_pairs(np.array([[1.0, np.nan], [1.0, 0.0]]), 0.5)
    with pytest.raises(ValueError):
        similar_pairs(x, 0.5, block_rows=0)
    with pytest.raises(ValueError):
        similar_pairs(np.ones(3), 0.5)
