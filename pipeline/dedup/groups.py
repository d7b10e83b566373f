"""The union step: duplicate pairs -> groups -> the ``duplicates`` table (pure; no I/O).

Rows are named by ``(partition_id, row)`` (plan order) and carry their ``key``. Pairs of
every kind and every generation are one undirected graph; its connected components
(``scipy.sparse.csgraph.connected_components``) are the duplicate groups, so a group
may chain rows through near or semantic pairs. The survivor of a group is its first row
in plan order, a rule that does not depend on scheduling, worker count or the order in
which pairs were found. Every other row gets one row in ``duplicates``: its survivor and
its strongest pair in the group (exact, else the smallest pHash distance, else the
highest cosine similarity).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

#: One row per found pair (the pairs files of the dedup pass).
PAIRS_SCHEMA = pa.schema([
    ("kind", pa.string()),
    ("a_key", pa.string()), ("a_partition_id", pa.string()), ("a_row", pa.int32()),
    ("b_key", pa.string()), ("b_partition_id", pa.string()), ("b_row", pa.int32()),
    ("hamming", pa.int32()),        # bits (exact: 0; semantic: null)
    ("similarity", pa.float32()),   # cosine (semantic only)
])

#: The result: one row per duplicate (rows not listed are survivors or unique).
DUPLICATES_SCHEMA = pa.schema([
    ("key", pa.string()), ("partition_id", pa.string()), ("row", pa.int32()),
    ("duplicate_of", pa.string()), ("duplicate_of_partition_id", pa.string()),
    ("duplicate_of_row", pa.int32()),
    ("kind", pa.string()),          # exact | near | semantic: the row's strongest pair
    ("hamming", pa.int32()),        # bits, for exact and near
    ("similarity", pa.float32()),   # cosine, for semantic
    ("group_size", pa.int32()),     # rows in the group, survivor included
])

_RANK = {"exact": 0, "near": 1, "semantic": 2}


def duplicates(pairs: pa.Table) -> pa.Table:
    """The ``duplicates`` table (``DUPLICATES_SCHEMA``, sorted by partition id and row)
    from the pairs of ``PAIRS_SCHEMA`` (any order, repeats allowed). Memory: O(pairs)."""
    if pairs.num_rows == 0:
        return DUPLICATES_SCHEMA.empty_table()
    a_pid, b_pid = pairs["a_partition_id"], pairs["b_partition_id"]
    pids = pc.unique(pa.chunked_array(a_pid.chunks + b_pid.chunks)).to_numpy(
        zero_copy_only=False).astype(object)
    pids.sort()
    a_p = np.searchsorted(pids, a_pid.to_numpy(zero_copy_only=False).astype(object))
    b_p = np.searchsorted(pids, b_pid.to_numpy(zero_copy_only=False).astype(object))
    a_row = pairs["a_row"].to_numpy().astype(np.int64)
    b_row = pairs["b_row"].to_numpy().astype(np.int64)
    code_a = (a_p.astype(np.int64) << 32) | a_row       # plan order as one int64
    code_b = (b_p.astype(np.int64) << 32) | b_row
    nodes, inverse = np.unique(np.r_[code_a, code_b], return_inverse=True)  # sorted: plan order
    m = pairs.num_rows
    ia, ib = inverse[:m], inverse[m:]
    keys = np.empty(len(nodes), dtype=object)
    keys[ia] = pairs["a_key"].to_numpy(zero_copy_only=False)
    keys[ib] = pairs["b_key"].to_numpy(zero_copy_only=False)
    graph = coo_matrix((np.ones(m, np.int8), (ia, ib)), shape=(len(nodes), len(nodes)))
    _, label = connected_components(graph, directed=False)
    # nodes are in plan order, so the first node of each label is its survivor
    first = np.full(label.max() + 1, len(nodes), np.int64)
    np.minimum.at(first, label, np.arange(len(nodes)))
    survivor = first[label]
    size = np.bincount(label)[label]
    kind, ham, sim = _strongest(pairs, ia, ib, len(nodes))
    dup = np.flatnonzero(survivor != np.arange(len(nodes)))
    s = survivor[dup]
    return pa.table({
        "key": pa.array(keys[dup], pa.string()),
        "partition_id": pa.array(pids[nodes[dup] >> 32], pa.string()),
        "row": pa.array((nodes[dup] & 0xFFFFFFFF).astype(np.int32)),
        "duplicate_of": pa.array(keys[s], pa.string()),
        "duplicate_of_partition_id": pa.array(pids[nodes[s] >> 32], pa.string()),
        "duplicate_of_row": pa.array((nodes[s] & 0xFFFFFFFF).astype(np.int32)),
        "kind": pa.array([("exact", "near", "semantic")[k] for k in kind[dup]], pa.string()),
        "hamming": pa.array(ham[dup], pa.int32(), mask=ham[dup] < 0),
        "similarity": pa.array(sim[dup], pa.float32(), mask=np.isnan(sim[dup])),
        "group_size": pa.array(size[dup].astype(np.int32)),
    }, schema=DUPLICATES_SCHEMA)


def _strongest(pairs: pa.Table, ia: np.ndarray, ib: np.ndarray, n: int):
    """Per node: the rank of its strongest pair's kind, its smallest Hamming distance
    among pairs of that kind (-1 if none) and its highest similarity (NaN if none)."""
    rank = np.array([_RANK[k] for k in pairs["kind"].to_pylist()], np.int64)
    ham = pairs["hamming"].fill_null(-1).to_numpy().astype(np.int64)
    sim = pairs["similarity"].fill_null(np.nan).to_numpy().astype(np.float64)
    node = np.r_[ia, ib]
    rank2, ham2, sim2 = np.r_[rank, rank], np.r_[ham, ham], np.r_[sim, sim]
    best = np.full(n, 3, np.int64)
    np.minimum.at(best, node, rank2)
    mine = rank2 == best[node]
    out_ham = np.full(n, np.iinfo(np.int64).max, np.int64)
    sel = mine & (ham2 >= 0)
    np.minimum.at(out_ham, node[sel], ham2[sel])
    out_ham[out_ham == np.iinfo(np.int64).max] = -1
    out_sim = np.full(n, -np.inf)
    sel = mine & ~np.isnan(sim2)
    np.maximum.at(out_sim, node[sel], sim2[sel])
    out_sim[np.isinf(out_sim)] = np.nan
    return best, out_ham, out_sim
