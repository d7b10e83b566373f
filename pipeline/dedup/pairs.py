"""Duplicate pairs inside one bucket of index rows (pure numpy; no I/O, no Ray).

A bucket's rows are numbered ``0..n-1``; a pair ``(a, b, value)`` names two of them. Only
pairs with at least one row in ``new`` (a boolean mask, n) are returned, so an incremental
pass never recomputes the pairs among rows an earlier generation already compared.

- ``exact_pairs``: rows with equal sha256; each row is paired with the first row (lowest
  ``order``) of its group - a star, so a group of k rows gives k - 1 pairs, not k².
- ``near_pairs``: rows whose 64-bit pHashes are at most ``d`` bits apart and that share a
  block (``index.near_blocks``: the bucket's rows are grouped by block index and value).
  Equal hashes are paired like exact rows (a star); the first rows of distinct hashes
  sharing a block are compared pairwise (XOR + popcount), group by group.
"""

from __future__ import annotations

import numpy as np

Pairs = tuple[np.ndarray, np.ndarray, np.ndarray]   # a int64 (m,), b int64 (m,), value (m,)


def _empty(value_dtype) -> Pairs:
    return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, value_dtype))


def _groups(codes: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, starts)``: row indices sorted by (code, order) and where each code's run
    starts (the first of each run has the lowest order)."""
    perm = np.lexsort((order, codes))
    c = codes[perm]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]]) if len(c) else np.zeros(0, np.int64)
    return perm, starts


def _star(perm: np.ndarray, starts: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (first of run, other member of run) where either is new."""
    n = len(perm)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    first = perm[starts][run]
    member = perm
    keep = (member != first) & (new[member] | new[first])
    return first[keep].astype(np.int64), member[keep].astype(np.int64)


def exact_pairs(sha256: np.ndarray, order: np.ndarray, new: np.ndarray) -> Pairs:
    """Pairs of rows with equal ``sha256`` (object array of hex strings, n); ``order``
    int64 (n,): plan order (lower first); ``new`` bool (n,). Value: 0 (int32)."""
    if len(sha256) == 0:
        return _empty(np.int32)
    _, codes = np.unique(sha256.astype(str), return_inverse=True)
    a, b = _star(*_groups(codes.reshape(-1), order), new)
    return a, b, np.zeros(len(a), np.int32)


def hamming(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bits that differ between two int64/uint64 arrays of 64-bit hashes -> int32."""
    return np.bitwise_count(x.astype(np.int64).view(np.uint64)
                            ^ y.astype(np.int64).view(np.uint64)).astype(np.int32)


def near_pairs(phash: np.ndarray, block: np.ndarray, block_value: np.ndarray,
               order: np.ndarray, new: np.ndarray, max_distance: int) -> Pairs:
    """Pairs of rows at most ``max_distance`` bits apart among rows that share a block.

    ``phash`` int64 (n,); ``block`` int (n,): the block index of each index row;
    ``block_value`` uint64 (n,): that block's bits; ``order`` int64 (n,); ``new`` bool (n,).
    A row of the index appears once per block, so rows are index rows and one record may
    be several rows: the caller maps rows to records and drops self-pairs. Value: the
    Hamming distance (int32, bits). The pairs connect every row to every row within
    ``max_distance`` through a chain (not every such pair is listed). Cost: O(n log n)
    plus, per (block, value) group of g distinct hashes, g²/2 comparisons."""
    if len(phash) == 0:
        return _empty(np.int32)
    a_all, b_all, d_all = [], [], []
    # equal hashes within a group: a star per (block, value, hash)
    _, codes = np.unique(np.stack([block.astype(np.int64), block_value.astype(np.int64),
                                   phash.astype(np.int64)], axis=1), axis=0, return_inverse=True)
    perm, starts = _groups(codes.reshape(-1), order)
    a, b = _star(perm, starts, new)
    a_all.append(a), b_all.append(b), d_all.append(np.zeros(len(a), np.int32))
    # distinct hashes: their first rows ("reps") compared within their block groups. An
    # edge between two reps joins their stars; it is new only if a rep is new (two old
    # reps were compared by the generation that indexed them).
    reps = perm[starts]
    _, gcodes = np.unique(np.stack([block[reps].astype(np.int64),
                                    block_value[reps].astype(np.int64)], axis=1),
                          axis=0, return_inverse=True)
    gperm, gstarts = _groups(gcodes.reshape(-1), order[reps])
    sizes = np.diff(np.r_[gstarts, len(gperm)])
    for start, size in zip(gstarts[sizes > 1], sizes[sizes > 1]):
        idx = reps[gperm[start:start + size]]
        i, j = np.triu_indices(size, 1)
        dist = hamming(phash[idx[i]], phash[idx[j]])
        hit = (dist <= max_distance) & (new[idx[i]] | new[idx[j]])
        a_all.append(idx[i][hit]), b_all.append(idx[j][hit]), d_all.append(dist[hit])
    return (np.concatenate(a_all).astype(np.int64), np.concatenate(b_all).astype(np.int64),
            np.concatenate(d_all).astype(np.int32))
