"""The union step: duplicate pairs -> groups -> the ``duplicates`` table (pure; no I/O).

Rows are named by ``(partition_id, row)`` (plan order) and carry their ``key``. Pairs of
every kind and every generation are one undirected graph; its connected components
(``scipy.sparse.csgraph.connected_components``) are the duplicate groups, so a group
may chain rows through near or semantic pairs. The survivor of a group is its first row
in plan order, a rule that does not depend on scheduling, worker count or the order in
which pairs were found. Every other row gets one row in ``duplicates``: its survivor and
its strongest pair in the group (exact, else the smallest pHash distance, else the
highest cosine similarity).

Frames (``dedup.dataset.frames``, video jobs): near pairs may join a frame of one video
to a frame of another (``index``: frame rows). ``duplicates(pairs, frames=True)`` then
adds, from the row's strongest pair, ``matched_key`` (the other row of that pair: the
survivor in a group of two, else the row it chains through), ``frame_index`` (this
row's frame in that pair) and ``matched_frame`` (the other row's); a frame is null where
the pair used the row's own pHash (an image's, a video's mosaic) or was exact. Without
frames the table has exactly ``DUPLICATES_SCHEMA`` (image jobs' output unchanged).
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
#: The pairs of an output whose index has frame rows: near pairs say which sampled frame
#: of each side matched (null: the row's own pHash; exact and semantic pairs: null).
FRAME_PAIRS_SCHEMA = pa.schema(list(PAIRS_SCHEMA) + [("a_frame", pa.int32()),
                                                     ("b_frame", pa.int32())])

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

#: The result with frames (``duplicates(pairs, frames=True)``; module docstring).
FRAME_DUPLICATES_SCHEMA = pa.schema(list(DUPLICATES_SCHEMA) + [
    ("matched_key", pa.string()),   # the other row of the strongest pair
    ("frame_index", pa.int32()),    # this row's sampled frame in it (null: whole row)
    ("matched_frame", pa.int32()),  # the other row's sampled frame in it
])

_RANK = {"exact": 0, "near": 1, "semantic": 2}


def pairs_schema(frames: bool) -> pa.Schema:
    """``FRAME_PAIRS_SCHEMA`` if ``frames`` else ``PAIRS_SCHEMA``."""
    return FRAME_PAIRS_SCHEMA if frames else PAIRS_SCHEMA


def duplicates_schema(frames: bool) -> pa.Schema:
    """``FRAME_DUPLICATES_SCHEMA`` if ``frames`` else ``DUPLICATES_SCHEMA``."""
    return FRAME_DUPLICATES_SCHEMA if frames else DUPLICATES_SCHEMA


def duplicates(pairs: pa.Table, frames: bool = False) -> pa.Table:
    """The ``duplicates`` table (``duplicates_schema(frames)``, sorted by partition id and
    row) from the pairs of ``pairs_schema(frames)`` (any order, repeats allowed). Memory:
    O(pairs)."""
    if pairs.num_rows == 0:
        return duplicates_schema(frames).empty_table()
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
    table = pa.table({
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
    if not frames:
        return table
    other, own_frame, other_frame = _strongest_pair(pairs, ia, ib, kind)
    return (table.append_column("matched_key", pa.array(keys[other[dup]], pa.string()))
            .append_column("frame_index", _frame_array(own_frame[dup]))
            .append_column("matched_frame", _frame_array(other_frame[dup])))


def _frame_array(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(np.int32), pa.int32(), mask=values < 0)


def _strongest_pair(pairs: pa.Table, ia: np.ndarray, ib: np.ndarray, best: np.ndarray):
    """Per node (``best``: its strongest kind's rank, ``_strongest``): the other node of
    its strongest pair (that kind, smallest Hamming distance, highest similarity; the
    first such pair on ties), and that pair's frame on this node's side and on the
    other's (-1: none). Every node is in at least one pair."""
    n = len(best)
    rank = np.array([_RANK[k] for k in pairs["kind"].to_pylist()], np.int64)
    ham = pairs["hamming"].fill_null(np.iinfo(np.int32).max).to_numpy().astype(np.int64)
    sim = pairs["similarity"].fill_null(-np.inf).to_numpy().astype(np.float64)
    a_frame = pairs["a_frame"].fill_null(-1).to_numpy().astype(np.int64)
    b_frame = pairs["b_frame"].fill_null(-1).to_numpy().astype(np.int64)
    node, other = np.r_[ia, ib], np.r_[ib, ia]
    own_f, other_f = np.r_[a_frame, b_frame], np.r_[b_frame, a_frame]
    mine = np.flatnonzero(np.r_[rank, rank] == best[node])
    mine = mine[np.lexsort((-np.r_[sim, sim][mine], np.r_[ham, ham][mine], node[mine]))]
    _, first = np.unique(node[mine], return_index=True)
    pick = np.full(n, -1, np.int64)
    pick[node[mine[first]]] = mine[first]
    return other[pick], own_f[pick], other_f[pick]


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
