"""The dedup pass's pure parts against brute force: index buckets, pairs per bucket, the
union step, and incremental generations (no Ray, no I/O)."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from pipeline.dedup import groups, index
from pipeline.dedup.tasks import bucket_pairs
from pipeline.spec import DatasetDedupSpec


def dataset(rng: np.random.Generator, n: int, d: int) -> list[dict]:
    """n records over 5 partitions: random pHashes, some re-used (exact copies: same
    sha256) and some within d bits of an earlier one (near copies)."""
    recs = []
    for i in range(n):
        r = rng.random()
        if recs and r < 0.2:                      # exact copy
            src = recs[rng.integers(len(recs))]
            ph, sha = src["phash"], src["sha256"]
        elif recs and r < 0.5:                    # near copy: flip up to d bits
            src = recs[rng.integers(len(recs))]
            flips = rng.choice(64, size=rng.integers(1, d + 1), replace=False)
            ph = int(np.int64(src["phash"]).view(np.uint64) ^ np.uint64(sum(1 << int(f) for f in flips)))
            ph = int(np.uint64(ph).view(np.int64))
            sha = hashlib.sha256(f"near{i}".encode()).hexdigest()
        else:
            ph = int(rng.integers(-2**63, 2**63 - 1, dtype=np.int64))
            sha = hashlib.sha256(f"rec{i}".encode()).hexdigest()
        recs.append({"key": f"k{i:04d}", "phash": ph, "sha256": sha})
    for i, rec in enumerate(recs):
        rec["partition_id"], rec["row"] = f"p-{i % 5:06d}", i // 5
    return recs


def brute_force(recs: list[dict], d: int) -> dict[str, str]:
    """key -> survivor key, from every pair within d bits or with equal sha256."""
    n = len(recs)
    ph = np.array([r["phash"] for r in recs], np.int64).view(np.uint64)
    dist = np.bitwise_count(ph[:, None] ^ ph[None, :])
    sha = np.array([r["sha256"] for r in recs])
    adj = (dist <= d) | (sha[:, None] == sha[None, :])
    i, j = np.nonzero(np.triu(adj, 1))
    _, label = connected_components(coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n)),
                                    directed=False)
    order = sorted(range(n), key=lambda k: (recs[k]["partition_id"], recs[k]["row"]))
    first = {}
    for k in order:
        first.setdefault(label[k], recs[k]["key"])
    return {recs[k]["key"]: first[label[k]] for k in range(n) if first[label[k]] != recs[k]["key"]}


def index_rows(recs: list[dict], spec: DatasetDedupSpec) -> dict[tuple[str, int], list[pa.Table]]:
    """(kind, bucket) -> index tables, one per partition, as IndexDatasink writes them."""
    by_pid = defaultdict(list)
    for r in recs:
        by_pid[r["partition_id"]].append(r)
    out = defaultdict(list)
    for pid, rs in sorted(by_pid.items()):
        tables = index.index_tables([r["key"] for r in rs], pid, [r["row"] for r in rs],
                                    [r["sha256"] for r in rs], [r["phash"] for r in rs], spec)
        for kb, t in tables.items():
            out[kb].append(t)
    return out


def run_generation(tables: dict, new_pids: set[str], d: int) -> pa.Table:
    found = [bucket_pairs(kind, pa.concat_tables(ts), new_pids, {"max_hamming_distance": d})
             for (kind, _), ts in sorted(tables.items())]
    return pa.concat_tables(found)


@pytest.mark.parametrize("seed,d,buckets", [(0, 4, 1), (1, 4, 7), (2, 2, 3), (3, 8, 16)])
def test_groups_equal_brute_force_connected_components(seed, d, buckets):
    recs = dataset(np.random.default_rng(seed), 300, d)
    spec = DatasetDedupSpec(enabled=True, buckets=buckets, max_hamming_distance=d)
    pids = {r["partition_id"] for r in recs}
    dup = groups.duplicates(run_generation(index_rows(recs, spec), pids, d))
    got = dict(zip(dup["key"].to_pylist(), dup["duplicate_of"].to_pylist()))
    expected = brute_force(recs, d)
    assert len(expected) > 50                       # the data has many duplicates
    assert got == expected
    by_key = {r["key"]: r for r in recs}
    for row in dup.to_pylist():                     # exact: the same bytes; near: within d
        other = [k for k in got if by_key[k]["sha256"] == by_key[row["key"]]["sha256"]]
        if row["kind"] == "exact":
            assert row["hamming"] == 0 and (len(other) > 1 or
                                            by_key[row["duplicate_of"]]["sha256"] ==
                                            by_key[row["key"]]["sha256"])
        else:
            assert row["kind"] == "near" and 0 <= row["hamming"] <= d


def test_incremental_generations_equal_one_generation():
    d = 4
    recs = dataset(np.random.default_rng(7), 300, d)
    spec = DatasetDedupSpec(enabled=True, buckets=5, max_hamming_distance=d)
    old = [r for r in recs if r["partition_id"] not in ("p-000001", "p-000003")]
    gen1 = run_generation(index_rows(old, spec), {r["partition_id"] for r in old}, d)
    gen2 = run_generation(index_rows(recs, spec), {"p-000001", "p-000003"}, d)
    # generation 2 found only pairs with a row of a new partition
    new_side = [a in ("p-000001", "p-000003") or b in ("p-000001", "p-000003") for a, b in
                zip(gen2["a_partition_id"].to_pylist(), gen2["b_partition_id"].to_pylist())]
    assert gen2.num_rows > 0 and all(new_side)
    once = groups.duplicates(run_generation(index_rows(recs, spec),
                                            {r["partition_id"] for r in recs}, d))
    assert groups.duplicates(pa.concat_tables([gen1, gen2])).equals(once)
    assert dict(zip(once["key"].to_pylist(), once["duplicate_of"].to_pylist())) == \
        brute_force(recs, d)


def test_survivor_is_first_in_plan_order_whatever_the_pair_order():
    pairs = pa.table({
        "kind": ["near", "exact", "near"],
        "a_key": ["x", "y", "z"], "a_partition_id": ["p-000002", "p-000000", "p-000001"],
        "a_row": [0, 5, 3],
        "b_key": ["y", "w", "x"], "b_partition_id": ["p-000000", "p-000003", "p-000002"],
        "b_row": [5, 1, 0],
        "hamming": [3, 0, 2], "similarity": [None, None, None]},
        schema=groups.PAIRS_SCHEMA)
    for perm in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        dup = groups.duplicates(pairs.take(perm)).to_pylist()
        assert [(r["key"], r["duplicate_of"], r["kind"], r["hamming"], r["group_size"])
                for r in dup] == [("z", "y", "near", 2, 4), ("x", "y", "near", 2, 4),
                                  ("w", "y", "exact", 0, 4)]


def test_bucket_rules_are_fixed():
    """Outputs index with these rules: changing them would split old and new rows of one
    duplicate group into different buckets, so the values are pinned."""
    assert index.exact_buckets(["ffffffffffffffff" + "0" * 48, "0" * 64], 16).tolist() == [15, 0]
    assert index.block_bounds(4) == [(51, 13), (38, 13), (25, 13), (12, 13), (0, 12)]
    blocks = index.near_blocks(np.array([-1, 0, 0x123456789ABCDEF], np.int64), 4)
    assert blocks[0].tolist() == [8191, 8191, 8191, 8191, 4095]
    assert blocks[1].tolist() == [0] * 5
    assert index.near_buckets(blocks, 16).tolist() == \
        index.near_buckets(blocks.copy(), 16).tolist()
    assert index.near_buckets(blocks, 1000)[1].tolist() == [55, 430, 857, 529, 661]
    # the same as SplitMix64's published mix, written out in plain Python
    assert index.near_buckets(blocks, 1000)[2].tolist() == \
        [_mix(_mix(int(v)) ^ b) % 1000 for b, v in enumerate(blocks[2])]


def _mix(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)
