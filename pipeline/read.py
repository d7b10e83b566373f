"""Reading a job's committed output: ``read_output`` gives one ``pyarrow.dataset.Dataset``
(for pyarrow, pandas and Ray Data) over the Parquet files the commit markers name;
``is_output`` tells an mmpipe output from any other location (``mmpipe ls``).

Only files named by a commit marker are output (DESIGN.md, commit protocol): files of
failed, lost or zombie attempts, WebDataset shards beside the Parquet files and anything
else under the output root are never read. ``committed_files(output, kind)``
lists the named files of one kind (``data``, ``quarantine``, ``wds``).
"""

from __future__ import annotations


import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.storage import fs
from pipeline.output.layout import OutputLayout, is_output
from pipeline.output import generations
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.committed import check_file_names

#: Per-file Parquet key-value metadata, left out of a whole dataset's schema metadata.
PER_FILE_KEYS = (b"mmpipe.partition_id", b"mmpipe.attempt_id")


def stored_spec(output: str):
    """The ``JobSpec`` an output was written with (the ``mmpipe.spec`` metadata of its
    committed data files). Raises ``FileNotFoundError`` as ``read_output``."""
    from pipeline.spec import JobSpec

    return JobSpec.model_validate_json(read_output(output).schema.metadata[b"mmpipe.spec"])


def read_output(output: str, columns: list[str] | None = None,
                kind: str = "data", deduplicated: bool = False) -> ds.Dataset:
    """The committed output of a job as a ``pyarrow.dataset.Dataset``.

    ``output``: the job's ``sink.uri`` (a local path or ``s3://``, read through the fs
    layer's ``pyarrow`` filesystem). ``kind``: ``"data"`` (every row, with its status) or
    ``"quarantine"`` (error rows with ``source_bytes``). ``columns``: read only these (the
    schema is then these fields, in this order). The dataset holds exactly the Parquet
    files named by commit markers, in partition order (``dataset.files``: paths on
    ``dataset.filesystem``) of the newest complete generation (``--mode overwrite``
    writes a new one: ``pipeline.output.generations``; while none is complete, the newest
    one). Its schema's metadata holds the files' ``mmpipe.version``,
    ``mmpipe.fingerprint`` and ``mmpipe.spec`` (the per-file ``mmpipe.partition_id`` and
    ``mmpipe.attempt_id`` are in each file's footer only). Nothing is read until asked:

    - pyarrow: ``read_output(out).to_table()`` (or ``.to_batches()``, ``.scanner(...)``)
    - pandas: ``read_output(out).to_table().to_pandas()``
    - Ray Data: ``d = read_output(out); ray.data.read_parquet(d.files, filesystem=d.filesystem)``

    ``deduplicated``: only the ``status == "ok"`` rows whose key the newest complete dedup
    pass (``mmpipe dedup``) did not list as a duplicate, matched by ``(partition_id, key)``
    (a filtered dataset; ``partition_id``, ``key`` and ``status`` are added to ``columns``
    if missing, the filter reads them); with no duplicate found, the ok rows. Raises
    ``FileNotFoundError`` if no dedup pass has completed on ``output``, and
    ``dedup.store.IncompleteDedupError`` (a ``FileNotFoundError``) if the newest complete
    one does not cover every committed partition (their duplicates would be kept).

    A committed output with no quarantine file (no error rows) gives an empty quarantine
    dataset: the data files' schema plus ``source_bytes``, ``source_sha256`` and
    ``source_size``, no files, 0 rows.

    Raises ``FileNotFoundError`` if ``output`` is not an mmpipe output or nothing is
    committed (there is then no schema), ``ValueError`` for another ``kind`` or a column the
    output does not have.
    """
    if kind not in ("data", "quarantine"):
        raise ValueError(f"kind {kind!r}: read_output reads 'data' or 'quarantine' "
                         "(WebDataset shards: checkpoint.committed_files(output, 'wds'))")
    files = committed_files(output, kind)
    if not files and kind == "quarantine":  # no error rows: empty, with the right schema
        data = read_output(output)
        # imported here: it imports Pillow, which `mmpipe ls` needs not
        from pipeline.output.sinks.quarantine import quarantine_schema

        schema = quarantine_schema(data.schema)
        dataset = ds.dataset([], schema=schema, format="parquet", filesystem=data.filesystem)
    elif not files:
        what = ("no committed files (no commit marker names one)"
                if is_output(output) else "is not an mmpipe output (no _plan/ or _checkpoints/)")
        raise FileNotFoundError(f"{output}{' ' if what.startswith('is ') else ': '}{what}")
    else:
        fsys, _ = fs.resolve(files[0])
        dataset = ds.dataset([fs.resolve(f)[1] for f in files], filesystem=fsys,
                             format="parquet")
    schema = dataset.schema
    if columns is not None:
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(f"{output}: no column(s) {missing} (columns: {schema.names})")
    if columns is not None and deduplicated:  # the dedup filter reads these two
        columns = list(columns) + [c for c in ("partition_id", "key", "status")
                                   if c not in columns]
    fields = [schema.field(c) for c in columns] if columns is not None else list(schema)
    meta = {k: v for k, v in (schema.metadata or {}).items() if k not in PER_FILE_KEYS}
    if deduplicated:
        from pipeline.dedup.store import covered_duplicates

        dups = covered_duplicates(output)   # FileNotFoundError / IncompleteDedupError
        keep = pc.field("status") == "ok"
        if dups.num_rows:   # (an empty table's columns have no chunks: no typed value set)
            # by (partition, key): keys are unique within a partition, an input may repeat one
            where = pc.Expression._call("binary_join_element_wise", [
                pc.field("partition_id"), pc.field("key"), pc.scalar("/")])
            dup = pc.binary_join_element_wise(dups["partition_id"], dups["key"], "/")
            keep = keep & ~where.isin(dup.combine_chunks())
        dataset = dataset.filter(keep)
    return dataset.replace_schema(pa.schema(fields, metadata=meta or None))


def committed_files(output_uri: str, kind: str | None = "data") -> list[str]:
    """URIs of the files named by commit markers (what readers should trust) in the newest
    complete generation of ``output_uri`` (``generations.read_root``), by partition
    id then in marker order. ``kind``: the top directory of the files (``generations.attempt_roots_of``):
    ``"data"`` (the Parquet data files, the default), ``"quarantine"`` or ``"wds"``
    (WebDataset shards); None: all of them. Raises ``ValueError`` for another ``kind``,
    ``CommitError`` naming the marker and the name for a marker that names a file outside
    its attempt's directories (``output.committed.check_file_names``: ``..``, absolute
    paths, another partition's files), before anything is read."""
    root = generations.read_root(output_uri)    # the newest complete generation
    known = generations.attempt_roots_of(root)  # with a job's own datasinks' directories
    if kind is not None and kind not in known:
        raise ValueError(f"kind {kind!r}: one of {known} or None")
    layout = OutputLayout(root)
    store = CheckpointStore(root)
    markers = sorted(store.markers().items())
    for pid, m in markers:   # a name outside its attempt's directories is refused, never read
        check_file_names(m, layout.marker(pid), known)
    return [layout.uri(f) for pid, m in markers
            for f in m.files if kind is None or f.startswith(kind + "/")]


def read_committed(output_uri: str, columns: list[str] | None = None):
    """The committed output as one ``pyarrow.Table``: ``pipeline.read.read_output(
    output_uri, columns).to_table()`` (only data files named by markers, in partition
    order; ``columns``: a subset). Raises ``FileNotFoundError`` if no partition is
    committed (there is then no schema to read)."""
    return read_output(output_uri, columns).to_table()
