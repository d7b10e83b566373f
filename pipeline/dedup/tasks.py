"""The dedup pass's units of work, as plain functions (no Ray): a ``DedupWorker`` actor
calls them, and so do the benchmark and the tests.

Task ids: ``exact-b-0003``, ``near-b-0003``, ``semantic-b-0003`` (a bucket of one
generation), ``centroids`` and ``assign/<pid>`` (output-wide semantic tasks). Each task
reads only what it owns, writes attempt-unique files under its attempt lease
(``store.DedupStore.lease``) and commits a ``TaskMarker`` (``store.DedupStore.commit``:
files verified, lease checked); a task whose marker exists is never run again.
"""

from __future__ import annotations

import logging
import resource
import time
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.dedup import index, pairs
from pipeline.dedup.groups import pairs_schema
from pipeline.errors import CommitError
from pipeline.dedup.store import LEASE_RENEW_S, LEASE_S, DedupStore, Generation, TaskMarker, new_id
from pipeline.storage import fs

log = logging.getLogger(__name__)

SEMANTIC_SCHEMA = pa.schema([("key", pa.string()), ("partition_id", pa.string()),
                             ("row", pa.int32()), ("embedding", pa.list_(pa.float32()))])
CENTROIDS = "centroids"
SEMANTIC_FILES = "semantic-files"   # the generation's semantic index-file list (driver)


def bucket_task(kind: str, bucket: int) -> str:
    """``exact-b-0003``."""
    return f"{kind}-b-{bucket:04d}"


def parse_bucket_task(task: str) -> tuple[str, int]:
    """``("exact", 3)`` for ``exact-b-0003``."""
    kind, _, b = task.rpartition("-b-")
    return kind, int(b)


def plan_order(pids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Rank of each ``(partition_id, row)`` in plan order (int64, n)."""
    order = np.lexsort((rows, pids))
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (bytes; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_task(output_uri: str, generation: Generation | None, task: str,
             ran_on: dict[str, str] | None = None, lease_s: float = LEASE_S,
             lease_renew_s: float = LEASE_RENEW_S) -> TaskMarker:
    """Run one task and commit it; return its marker (the winner's, if another attempt
    committed first). The attempt holds a lease (``lease_s`` seconds, renewed every
    ``lease_renew_s``) from before its first file until it has committed or cleaned up.
    Raises what storage raises, and ``CommitError`` if a file it wrote is gone or changed
    before the commit or its lease ran low (the caller retries the task)."""
    store = DedupStore(output_uri)
    started, attempt = time.time(), new_id()
    lease = store.lease(task, attempt, lease_s, lease_renew_s)
    try:
        if task == CENTROIDS:
            files, rows_in, found = _centroids(store, generation, attempt)
        elif task.startswith("assign/"):
            files, rows_in, found = _assign(store, task.split("/", 1)[1], attempt)
        else:
            files, rows_in, found = _bucket(store, generation, task, attempt)
        marker = TaskMarker(task=task,
                            generation=0 if generation is None else generation.generation,
                            attempt_id=attempt, files=[f for f, _, _ in files],
                            sha256={f: h for f, h, _ in files}, rows_in=rows_in, pairs=found,
                            seconds=round(time.time() - started, 3), ran_on=ran_on or {},
                            peak_rss_bytes=peak_rss_bytes())
        scope = None if task == CENTROIDS or task.startswith("assign/") \
            else generation.generation
        try:
            won = store.commit(scope, marker, lease)
        except CommitError:
            _discard(store, marker.files)        # the attempt fails; a retry writes anew
            raise
        if not won:
            _discard(store, marker.files)
            return store.marker(scope, task)
        return marker
    finally:
        lease.release()


def _discard(store: DedupStore, files: list[str]) -> None:
    """Delete an attempt's own files (those already gone are skipped)."""
    for f in files:
        fs.delete_file(store.uri(f))


def _bucket(store: DedupStore, gen: Generation, task: str, attempt: str):
    kind, bucket = parse_bucket_task(task)
    listed = store.generation_files(gen, kind, bucket)
    new_pids = set(listed.filter(listed["new"])["partition_id"].to_pylist())
    schema = SEMANTIC_SCHEMA if kind == "semantic" else index.SCHEMAS[kind]
    table = store.read_tables(listed["file"].to_pylist(), schema)
    out = bucket_pairs(kind, table, new_pids, gen.settings)
    if out.num_rows == 0:
        return [], table.num_rows, 0
    rel = f"_dedup/pairs/{kind}/b-{bucket:04d}/g-{gen.generation:06d}.a-{attempt}.parquet"
    sha, size = store.write_table(rel, out)
    return [(rel, sha, size)], table.num_rows, out.num_rows


def bucket_pairs(kind: str, table: pa.Table, new_pids: set[str],
                 settings: dict) -> pa.Table:
    """The pairs (``groups.PAIRS_SCHEMA``) among one bucket's index rows ``table``
    (``index.SCHEMAS[kind]`` or ``SEMANTIC_SCHEMA``) that have a row of a partition in
    ``new_pids``; each pair (earlier, later) in plan order, sorted. ``settings``:
    ``max_hamming_distance`` (near), ``semantic_threshold`` (semantic), ``frames`` (the
    index has frame rows: the pairs are ``groups.FRAME_PAIRS_SCHEMA``, each side's
    ``frame`` in ``a_frame``/``b_frame``, null for a row's own pHash). A near pair of a
    row with itself (two of its frames) is dropped."""
    frames = bool(settings.get("frames"))
    schema = pairs_schema(frames)
    if table.num_rows == 0:
        return schema.empty_table()
    pids = table["partition_id"].to_numpy(zero_copy_only=False).astype(object)
    rows = table["row"].to_numpy().astype(np.int64)
    order = plan_order(pids, rows)
    new = np.isin(pids, list(new_pids)) if new_pids else np.zeros(len(pids), bool)
    ham = sim = None
    if kind == "exact":
        a, b, ham = pairs.exact_pairs(table["sha256"].to_numpy(zero_copy_only=False),
                                      order, new)
    elif kind == "near":
        d = settings["max_hamming_distance"]
        ph = table["phash"].to_numpy()
        blk = table["block"].to_numpy().astype(np.int64)
        values = index.near_blocks(ph, d)[np.arange(len(ph)), blk]
        a, b, ham = pairs.near_pairs(ph, blk, values, order, new, d)
    else:
        from pipeline.dedup import semantic

        emb = np.stack(table["embedding"].to_numpy(zero_copy_only=False)).astype(np.float32)
        i, j, sim = semantic.similar_pairs(emb, settings["semantic_threshold"])
        keep = new[i] | new[j]
        a, b, sim = i[keep], j[keep], sim[keep]
    if kind == "near":                           # frames of one row: not a duplicate
        other = (pids[a] != pids[b]) | (rows[a] != rows[b])
        a, b, ham = a[other], b[other], ham[other]
    swap = order[a] > order[b]                  # (earlier, later): repeats compare equal
    a, b = np.where(swap, b, a), np.where(swap, a, b)
    frame = table["frame"] if "frame" in table.column_names else pa.nulls(table.num_rows,
                                                                          pa.int32())
    framed = {"a_frame": frame.take(a), "b_frame": frame.take(b)} if frames else {}
    out = pa.table({
        "kind": pa.array([kind] * len(a), pa.string()),
        "a_key": table["key"].take(a), "a_partition_id": table["partition_id"].take(a),
        "a_row": table["row"].take(a),
        "b_key": table["key"].take(b), "b_partition_id": table["partition_id"].take(b),
        "b_row": table["row"].take(b),
        "hamming": pa.array(ham if ham is not None else [None] * len(a), pa.int32()),
        "similarity": pa.array(sim if sim is not None else [None] * len(a), pa.float32()),
        **framed}, schema=schema)
    return out.sort_by([("a_partition_id", "ascending"), ("a_row", "ascending"),
                        ("b_partition_id", "ascending"), ("b_row", "ascending")])


# --- semantic (SemDeDup) --------------------------------------------------------------
def _embeddings(store: DedupStore, data_file: str) -> tuple[pa.Table, np.ndarray]:
    """The ok rows of one committed data file that have an image embedding: ``(rows
    table (key, row), embeddings float32 (n, d))``."""
    fsys, path = fs.resolve(store.uri(data_file))
    table = fs.with_retries(store.uri(data_file), "read", lambda: pq.read_table(
        path, filesystem=fsys, columns=["key", "status", "image_embedding"]))
    table = table.append_column("row", pa.array(np.arange(table.num_rows, dtype=np.int32)))
    table = table.filter(pc.and_(pc.equal(table["status"], "ok"),
                                 pc.is_valid(table["image_embedding"])))
    if table.num_rows == 0:
        return table, np.zeros((0, 0), np.float32)
    emb = np.stack(table["image_embedding"].to_numpy(zero_copy_only=False)).astype(np.float32)
    return table, emb


def data_files(store: DedupStore, pids: list[str]) -> list[str]:
    """The committed data files of ``pids`` (from their commit markers), in plan order.
    Raises ``CommitError`` for a marker that names a file outside its attempt's
    directories (``output.committed.check_file_names``), before anything is read."""
    from pipeline.output.checkpoint import CheckpointStore
    from pipeline.output.committed import check_file_names
    from pipeline.output.generations import attempt_roots_of

    cp = CheckpointStore(store.output_uri)
    roots = attempt_roots_of(store.output_uri)
    out = []
    for pid in sorted(pids):
        m = cp.marker(pid)
        if m is None:
            continue
        check_file_names(m, cp.layout.marker(pid), roots)
        out += [f for f in m.files if f.startswith("data/")]
    return out


def _centroids(store: DedupStore, gen: Generation, attempt: str):
    """Fit the k-means centroids on a reservoir sample of the embeddings of every
    partition ``gen`` covers (streamed: one data file at a time). Later generations keep
    these centroids, so their clusters stay comparable."""
    from pipeline.dedup import semantic

    settings, pids = gen.settings, list(gen.partitions)
    sample = semantic.CentroidSample(settings["semantic_sample_size"], seed=0)
    for f in data_files(store, pids):
        _, emb = _embeddings(store, f)
        if len(emb):
            sample.add(emb)
    if sample.seen == 0:
        raise ValueError("semantic dedup: no ok row has an image_embedding "
                         "(enable image_embedding in the job spec)")
    centroids = semantic.fit_centroids(sample.sample(), settings["semantic_clusters"], seed=0)
    rel = f"_dedup/semantic/centroids.a-{attempt}.npy"
    out = fs.HashingOutput(store.uri(rel))
    np.save(out, centroids.astype(np.float32))
    out.close()
    return [(rel, out.sha256, out.size)], sample.seen, 0


def load_centroids(store: DedupStore) -> np.ndarray | None:
    """The committed centroids (float32, k x d), or None."""
    import io

    m = store.marker(None, CENTROIDS)
    if m is None:
        return None
    return np.load(io.BytesIO(fs.read_bytes(store.uri(m.files[0]))))


def _assign(store: DedupStore, pid: str, attempt: str):
    """Assign one partition's embeddings to their nearest centroid: one semantic index
    file per cluster it has rows in."""
    from pipeline.dedup import semantic

    centroids = load_centroids(store)
    written, rows_in = [], 0
    for f in data_files(store, [pid]):
        table, emb = _embeddings(store, f)
        if not len(emb):
            continue
        rows_in += len(emb)
        cluster = semantic.assign(emb, centroids)
        for c in np.unique(cluster):
            sel = np.flatnonzero(cluster == c)
            part = pa.table({"key": table["key"].take(sel),
                             "partition_id": pa.array([pid] * len(sel), pa.string()),
                             "row": table["row"].take(sel),
                             "embedding": pa.array(list(emb[sel]), pa.list_(pa.float32()))},
                            schema=SEMANTIC_SCHEMA)
            rel = f"_dedup/semantic/index/b-{int(c):04d}/{pid}.a-{attempt}.parquet"
            sha, size = store.write_table(rel, part)
            written.append((rel, sha, size))
    return written, rows_in, 0
