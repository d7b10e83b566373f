"""Generations of one output: ``--mode overwrite`` writes a new one beside the old.

```
<output>/
  _generations/g-000001.json        record of generation 1 (GenerationRecord), whose
  _plan/ _checkpoints/ _failures/   files are at the root: the layout of an output
  _leases/ data/ quarantine/ wds/   written before generations existed (an output with
  _index/ _dedup/ _SUCCESS          root files and no record is generation 1 too)
  _generations/g-000002.json        record of generation 2 (exclusive create)
  _generations/g-000002/_plan/ ... _SUCCESS    its files: the same layout, one level down
  _job/lease-000003.json            the job lease (pipeline.output.job_lease)
```

A generation is complete when its ``_SUCCESS`` exists. Readers of the output
(``read_root``: ``read_output``, ``committed_files``, ``mmpipe ls/export/dedup``) use the
newest complete generation, else (no generation complete yet) the newest one;
``mmpipe status`` shows the newest generation (the one a running job writes:
``newest_root``). A job in ``resume`` mode continues the newest generation; in
``overwrite`` mode it creates the next one and leaves the older ones alone until it is
complete, then deletes them (``delete_older``; ``mmpipe gc`` finishes an interrupted
deletion). The record holds the fingerprint: together with the job lease (one writer,
one fingerprint per generation) no marker of another fingerprint can exist in a
generation, so a resume decides what is done from one listing of marker names.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
import time
from typing import Any

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field

from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output.layout import (CHECKPOINT_DIR, DEDUP_DIR, GEN_DIR, INDEX_DIR,
                                     JOB_LEASE_DIR, PLAN_DIR, PLAN_INDEX_FILE, SUCCESS_FILE,
                                     attempt_root_names, owned_files, root_entries)

log = logging.getLogger(__name__)

_RECORD = re.compile(r"^g-(\d{6,})\.json$")
_DIR = re.compile(r"^g-(\d{6,})$")


class GenerationRecord(BaseModel):
    """``_generations/g-<n>.json``: ``generation`` number; ``fingerprint`` and
    ``settings`` of the spec whose markers it holds; ``source_sha256`` of its plan's
    source spec; ``job`` name, ``run_id`` and ``mode`` of the run that created it;
    ``created_at`` (Unix seconds); ``attempt_roots``: the attempt directories its
    datasinks write (``layout.register_attempt_root``), so gc and deletion in a process
    that never loaded a job's own datasink still know its directory."""

    model_config = ConfigDict(extra="ignore")

    generation: int
    fingerprint: str
    settings: dict[str, Any] = Field(default_factory=dict)
    source_sha256: str = ""
    job: str = ""
    run_id: str = ""
    mode: str = ""
    created_at: float = 0.0
    attempt_roots: list[str] = Field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generation of an output: ``number``, ``root`` (where its files are) and its
    ``record`` (None for generation 1 of an output written before records existed)."""

    number: int
    root: str
    record: GenerationRecord | None


def generation_root(output: str, number: int) -> str:
    """Where generation ``number``'s files are: the output root for 1, else
    ``_generations/g-<number>``."""
    out = fs.normalize(output)
    return out if number == 1 else fs.join(out, GEN_DIR, f"g-{number:06d}")


def record_uri(output: str, number: int) -> str:
    return fs.join(fs.normalize(output), GEN_DIR, f"g-{number:06d}.json")


def _names(uri: str) -> list[str]:
    """Names directly under the prefix ``uri`` (one non-recursive listing)."""
    fsys, path = fs.resolve(uri)
    selector = pafs.FileSelector(path, recursive=False, allow_not_found=True)
    try:
        infos = fs.with_retries(uri, "list", lambda: fsys.get_file_info(selector))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [posixpath.basename(i.path.rstrip("/")) for i in infos]


def _has_root_output(output: str) -> bool:
    """True if generation-1 files are at the root (a plan index or a commit marker)."""
    out = fs.normalize(output)
    if fs.file_size(fs.join(out, PLAN_INDEX_FILE)) is not None:
        return True
    return next(iter(fs.list_files(fs.join(out, CHECKPOINT_DIR))), None) is not None


def list_generations(output: str) -> list[Generation]:
    """The generations of ``output``, oldest first (one listing of ``_generations/``, a
    read per record; generation 1 without a record: a look at the root). Raises
    ``PlanError`` for an unreadable record."""
    out = fs.normalize(output)
    numbers = set()
    records: dict[int, GenerationRecord] = {}
    for name in _names(fs.join(out, GEN_DIR)):
        m = _RECORD.match(name)
        if m:
            n = int(m.group(1))
            numbers.add(n)
            try:
                records[n] = GenerationRecord.model_validate_json(
                    fs.read_bytes(record_uri(out, n)))
            except FileNotFoundError:
                numbers.discard(n)
            except ValueError as e:
                raise PlanError(f"unreadable generation record {record_uri(out, n)}: {e}") from e
    if 1 not in numbers and _has_root_output(out):
        numbers.add(1)
    return [Generation(n, generation_root(out, n), records.get(n)) for n in sorted(numbers)]


def is_complete(root: str) -> bool:
    """True if the generation at ``root`` has its ``_SUCCESS``."""
    return fs.file_size(fs.join(root, SUCCESS_FILE)) is not None


def newest_complete(gens: list[Generation]) -> Generation | None:
    """The newest generation of ``gens`` whose ``_SUCCESS`` exists (a HEAD per
    generation, newest first), or None."""
    for g in reversed(gens):
        if is_complete(g.root):
            return g
    return None


def read_root(output: str) -> str:
    """The root readers use: the newest complete generation's, else the newest
    generation's, else ``output`` itself (normalised). A generation root given as
    ``output`` is returned as is."""
    gens = list_generations(output)
    if not gens:
        return fs.normalize(output)
    done = newest_complete(gens)
    return (done or gens[-1]).root


def newest_root(output: str) -> str:
    """The newest generation's root (what a running job writes), else ``output``."""
    gens = list_generations(output)
    return gens[-1].root if gens else fs.normalize(output)


def create(output: str, record: GenerationRecord) -> bool:
    """Create the record of ``record.generation`` exclusively; False if it exists."""
    return fs.create_exclusive(record_uri(output, record.generation),
                               record.model_dump_json(indent=1).encode())


def replace_record(output: str, record: GenerationRecord) -> None:
    """Rewrite a generation's record (only while holding the job lease, and only for a
    generation with no commit marker: a new fingerprint adopts an empty generation)."""
    fs.write_bytes(record_uri(output, record.generation), record.model_dump_json(indent=1).encode())


def delete_generation(output: str, gen: Generation) -> None:
    """Delete generation ``gen``: ``_SUCCESS`` first (it is no longer complete), then its
    files, then its record. Only files of mmpipe's own layout are deleted
    (``layout.owned_files``, with the attempt roots its record names): a user's
    ``data/labels.csv`` beside them, a nested output, or what a symbolic link points at
    stays; the folders the deletion emptied are removed (locally), those still holding
    other files stay."""
    out = fs.normalize(output)
    fs.delete_file(fs.join(gen.root, SUCCESS_FILE))
    extra = gen.record.attempt_roots if gen.record else ()
    files = [e.uri for e in owned_files(gen.root, extra)]
    for uri in files:
        fs.delete_file(uri)
    if fs.is_local(gen.root):
        _remove_emptied_dirs(gen.root, extra, keep_root=gen.number == 1)
    fs.delete_file(record_uri(out, gen.number))
    log.info("%s: deleted generation %d (%s)", out, gen.number, gen.root)


#: Folder names of mmpipe's layout below an attempt root: a partition's, an attempt's, a
#: dedup index bucket's, a Delta table's log (the quarantine table, ``output.table``).
_LAYOUT_DIR = re.compile(r"^(p-\d{6,}|a-[A-Za-z0-9][A-Za-z0-9_-]*|b-\d+|_delta_log)$")


def _remove_emptied_dirs(root: str, extra: tuple[str, ...] | list[str], keep_root: bool
                         ) -> None:
    """Remove the local folders of mmpipe's layout under ``root`` that are empty now:
    its root entries (``_checkpoints/``, ``data/``, ...) and, inside them, folders named
    like a partition's, an attempt's or a bucket's (any under ``_dedup/``, a kind under
    ``_index/``), deepest first; ``root`` too unless ``keep_root``. Never through a
    symbolic link; ``os.rmdir`` leaves a folder that still holds anything."""
    def prune(path: bytes, depth: int, anything: bool, index: bool) -> None:
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for e in entries:
            name = os.fsdecode(e.name)
            if e.is_dir(follow_symlinks=False) and (
                    anything or _LAYOUT_DIR.match(name) or (index and depth == 0)):
                prune(e.path, depth + 1, anything, index)
        try:
            os.rmdir(path)
        except OSError:
            pass

    base = fs.uri_to_bytes(fs.normalize(root))
    for entry in root_entries(extra):
        top = os.path.join(base, entry.encode())
        if os.path.isdir(top) and not os.path.islink(top):
            prune(top, 0, entry == DEDUP_DIR, entry == INDEX_DIR)
    if not keep_root:
        try:
            os.rmdir(base)
        except OSError:
            pass


def delete_older(output: str, number: int) -> list[int]:
    """Delete every generation older than ``number`` (which must be complete); return
    the numbers deleted."""
    gone = []
    for g in list_generations(output):
        if g.number < number:
            delete_generation(output, g)
            gone.append(g.number)
    return gone


# --- where a job may write ---------------------------------------------------------------
def canonical(uri: str) -> str:
    """``uri`` normalised for comparison: a local path resolved (``os.path.realpath``:
    ``.``/``..`` and symbolic links), an ``s3://`` URI with its key normalised (no
    ``.``/``//``, no trailing ``/``)."""
    if fs.is_local(uri):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return os.path.realpath(os.path.expanduser(path))
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://"):].partition("/")
        key = posixpath.normpath("/" + key).lstrip("/") if key.strip("/") else ""
        return f"s3://{bucket}/{key}".rstrip("/")
    return uri.rstrip("/")


def overlaps(a: str, b: str) -> bool:
    """True if the canonical locations ``a`` and ``b`` are equal or one holds the other."""
    a, b = canonical(a), canonical(b)
    if a == b:
        return True
    return a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def is_bucket_root(uri: str) -> bool:
    """True for ``s3://bucket`` and ``s3://bucket/`` (no key)."""
    return uri.startswith("s3://") and canonical(uri).count("/") == 2


def check_locations(spec) -> None:
    """Refuse an output that overlaps an input (``source.uri``, ``source.allowed_roots``)
    after normalising (``canonical``), and a bucket root as output unless
    ``sink.allow_bucket_root``. Raises ``PlanError``."""
    out = spec.sink.uri
    inputs = [spec.source.uri, *(getattr(spec.source, "allowed_roots", None) or [])]
    for src in inputs:
        if overlaps(src, out):
            raise PlanError(f"sink.uri {out!r} and the input {src!r} overlap (resolved: "
                            f"{canonical(out)!r}, {canonical(src)!r}): an output must not "
                            "hold an input or lie inside one; use another output location")
    if is_bucket_root(out) and not getattr(spec.sink, "allow_bucket_root", False):
        raise PlanError(f"sink.uri {out!r} is a bucket root: an output owns its whole "
                        "prefix (overwrite and gc delete in it); use s3://bucket/prefix, or "
                        "set sink.allow_bucket_root: true if the bucket is the job's alone")


#: Root entries that make a location an mmpipe output for ``check_foreign`` (a run that
#: took the job lease and stopped before planning left ``_job/``).
OUTPUT_ROOT_MARKERS = (PLAN_DIR, CHECKPOINT_DIR, GEN_DIR, JOB_LEASE_DIR, SUCCESS_FILE)


def foreign_entries(output: str) -> list[str]:
    """The names directly under ``output`` (sorted) if it holds something and is not an
    mmpipe output (no ``OUTPUT_ROOT_MARKERS`` entry), else ``[]`` (one non-recursive
    listing). Raises ``StorageError``."""
    names = sorted(set(_names(output)))
    if not names or any(n in OUTPUT_ROOT_MARKERS for n in names):
        return []
    return names


def check_foreign(spec) -> None:
    """Refuse (``PlanError``, before anything is written) a ``sink.uri`` that is not empty
    and is not an mmpipe output, naming its first entries, unless
    ``sink.allow_foreign_files``. Raises ``StorageError`` if the store fails."""
    out = spec.sink.uri
    if getattr(spec.sink, "allow_foreign_files", False):
        return
    names = foreign_entries(out)
    if names:
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} entries)" if len(names) > 5 else "")
        raise PlanError(f"sink.uri {out!r} is not empty and is not an mmpipe output (it holds "
                        f"{shown}): nothing was written; use a new or empty location, or set "
                        "sink.allow_foreign_files: true (--set sink.allow_foreign_files=true) "
                        "to write beside these files (gc and --mode overwrite never delete "
                        "them)")


def new_record(number: int, pipeline, source_sha256: str, run_id: str, mode: str
               ) -> GenerationRecord:
    """The record of a new generation ``number`` for ``pipeline`` (an assembled
    ``Pipeline``: its spec, fingerprint and settings)."""
    return GenerationRecord(generation=number, fingerprint=pipeline.fingerprint,
                            settings=pipeline.settings(), source_sha256=source_sha256,
                            job=pipeline.spec.name, run_id=run_id, mode=mode,
                            created_at=time.time(),
                            attempt_roots=sorted({s.directory for s in pipeline.datasinks}))


def output_of(root: str) -> str:
    """The output a generation root belongs to: ``<output>`` for
    ``<output>/_generations/g-000002``, else ``root`` itself (generation 1)."""
    root = fs.normalize(root)
    parent, name = posixpath.split(root)
    if _DIR.match(name) and posixpath.basename(parent) == GEN_DIR:
        return posixpath.dirname(parent)
    return root


def attempt_roots_of(root: str) -> list[str]:
    """The attempt directories of the generation at ``root``: the registered ones plus
    those its record names (``layout.attempt_root_names``). Raises ``PlanError``."""
    record = record_of_root(root)
    return attempt_root_names(record.attempt_roots if record else ())


def record_of_root(root: str) -> GenerationRecord | None:
    """The record of the generation whose files are at ``root``; None if it has none
    (generation 1 of an output written before records existed). Raises ``PlanError``."""
    root = fs.normalize(root)
    output = output_of(root)
    number = 1 if output == root else int(posixpath.basename(root)[2:])
    try:
        return GenerationRecord.model_validate_json(fs.read_bytes(record_uri(output, number)))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise PlanError(f"unreadable generation record {record_uri(output, number)}: {e}") from e
