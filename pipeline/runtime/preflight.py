"""Cheap checks before Ray starts: the input, the output and the models of a job spec.

``mmpipe run`` calls ``preflight(spec)`` before ``ray.init``, so a missing input, an output
committed under another spec or a model that is not there fails in about a second (the
imports), with exit code 2, instead of after Ray's start-up. The driver runs the same
output check again when it lists the commit markers (``committed_markers``), so a job
started some other way (tests, a submitted job) is refused just the same.

Nothing here imports Ray; each check does at most a few listings and small reads.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from pipeline.errors import PlanError
from pipeline.storage import fs
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore, CommitMarker
from pipeline.output.committed import Committed
from pipeline.spec import JobSpec


class Preflight(NamedTuple):
    """What ``preflight`` found: the (unbound) ``pipeline``, and ``nothing_to_run``: True when
    every planned partition is already committed under its fingerprint (``check_output``),
    so a run only reports and needs no Ray (``driver.run_job`` touches Ray only to run
    partitions)."""

    pipeline: Any
    nothing_to_run: bool


def preflight(spec: JobSpec, models: bool = True) -> Preflight:
    """Run every check of this module for ``spec``; return what it found (``Preflight``).

    Checks, in order: the spec assembles (``AssemblyError``); ``source.uri`` exists and
    lists something fit for ``source.kind`` (``check_source``); the output can take this
    spec (``check_output``); with ``models``, every enabled model is present and complete
    (``models.registry.check_models``, ``ModelLoadError``). Configures ``pipeline.storage.fs``
    from ``spec.storage`` first. Every error raised is an ``MmpipeError`` (exit code 2).
    """
    from pipeline.assembly import assemble
    from pipeline.models.registry import check_models

    fs.configure(**spec.storage.model_dump())  # first: assembling may read (flagged words)
    pipeline = assemble(spec)
    check_source(spec)
    done = check_output(spec, pipeline)
    if models:
        check_models(spec)
    return Preflight(pipeline, done)


def submit_checks(spec: JobSpec, head_is_local: bool) -> None:
    """The checks of ``preflight`` that hold where a submitted job runs (``mmpipe submit``).

    A relative local ``source.uri`` travels with the uploaded checkout, so it is checked
    here (``check_source``); an absolute local one only when the head is on this machine
    (``head_is_local``), and so is an absolute local output (``check_output``). ``s3://``
    locations and models are left to the job's own ``mmpipe run`` (the cluster may hold
    other credentials and caches). Raises ``PlanError`` or ``AssemblyError``."""
    src, out = spec.source.uri, spec.sink.uri
    if fs.is_local(src) and (head_is_local or not os.path.isabs(src)):
        check_source(spec)
    if fs.is_local(out) and os.path.isabs(out) and head_is_local:
        from pipeline.assembly import assemble

        check_output(spec, assemble(spec))


def check_source(spec: JobSpec) -> None:
    """``source.uri`` exists and lists at least one file; a ``manifest`` source holds
    manifest files (Parquet, CSV, JSONL). One listing (a local directory is walked only
    until its first file, an S3 prefix reads one page). Raises ``PlanError``."""
    src = spec.source
    uri = src.uri
    try:
        if fs.file_size(uri) is not None:                # one file: a manifest or a shard
            if src.kind == "files":
                raise PlanError(f"source.uri {uri!r} is a file; source.kind=files takes a "
                                "directory (prefix) of media files")
            return
        if not _lists_a_file(uri):
            what = ("does not exist" if fs.is_local(uri) and not fs.exists(uri)
                    else "holds no files")
            raise PlanError(f"source.uri {uri!r} {what}")
        if src.kind == "manifest":
            _check_manifests(spec)
    except (OSError, ValueError) as e:
        raise PlanError(f"source.uri {uri!r}: cannot list it: {e}") from e


def _check_manifests(spec: JobSpec) -> None:
    """A ``manifest`` source prefix holds manifest files (``manifest.list_manifests``, which
    leaves out the ``.json`` caption sidecars of media files). Raises ``PlanError``."""
    from pipeline.input.manifest_rows import list_manifests

    src = spec.source
    if not list_manifests(src.uri, src.manifest_format):
        fmt = "" if src.manifest_format == "auto" else f" ({src.manifest_format})"
        raise PlanError(f"source.uri {src.uri!r}: source.kind is manifest but no manifest "
                        f"files{fmt} (.parquet, .csv, .jsonl; not the .json sidecars of "
                        "media files) are there; for a directory of media files with sidecar "
                        "captions use --set source.kind=files (with a spec written for "
                        "files, e.g. examples/images.yaml: manifest-only fields such as "
                        "path_column are errors there)")


def _lists_a_file(uri: str) -> bool:
    """True if the prefix ``uri`` holds at least one file (lazily: the first one found)."""
    if fs.is_local(uri):
        root = os.path.expanduser(uri.removeprefix("file://"))
        if not os.path.isdir(root):
            return False
        for _, _, files in os.walk(root, onerror=_raise, followlinks=True):
            if files:
                return True
        return False
    return next(iter(fs.list_files(uri)), None) is not None


def _raise(e: OSError) -> None:
    raise e


def check_output(spec: JobSpec, pipeline) -> bool:
    """The output location can take this spec under ``runtime.mode``: it overlaps no
    input and is not a bucket root unless allowed (``generations.check_locations``); it
    is empty or an mmpipe output unless ``sink.allow_foreign_files``
    (``generations.check_foreign``); no live job lease holds it (``job_lease.check_free``:
    ``OutputBusy`` names the holder); with
    ``error-if-exists`` it is empty (``check_empty``); with ``resume`` or ``append`` the stored plan of
    its newest generation was made for this source spec and nothing there was committed
    under another fingerprint (``committed_markers``); ``overwrite`` writes a new
    generation, so any content is fine. Returns True when there is nothing to run
    (``resume``, never ``append``, which lists the input first; a stored plan, every planned partition committed under
    ``pipeline.fingerprint``). Raises ``PlanError``."""
    from pipeline.output import generations, job_lease

    mode = spec.runtime.mode
    generations.check_locations(spec)
    generations.check_foreign(spec)       # a folder mmpipe did not make: refused, named
    job_lease.check_free(spec.sink.uri)
    if mode == "error-if-exists":
        check_empty(spec.sink.uri)
    elif mode in ("resume", "append"):
        root = generations.newest_root(spec.sink.uri)
        plan = planning.check_stored_plan(root, spec.source)
        done = committed_markers(root, pipeline)
        return mode == "resume" and plan is not None and all(
            pid in done for pid in plan.partition_ids)
    return False


def check_empty(output_uri: str) -> None:
    """Raise ``PlanError`` if ``output_uri`` holds any file (``runtime.mode`` error-if-exists)."""
    if next(iter(fs.list_files(output_uri)), None) is not None:
        raise PlanError(f"sink.uri {output_uri!r} is not empty and runtime.mode is "
                        "error-if-exists")


def committed_markers(output_uri: str, pipeline) -> Committed:
    """The partitions committed in the generation at ``output_uri`` (a generation root,
    ``generations.newest_root``) for ``pipeline.fingerprint``, as a ``Committed`` mapping
    (partition id -> marker; the ids from one listing of marker names, each marker read
    only when asked for). The generation's record holds its fingerprint, and the job
    lease keeps one fingerprint per generation, so no marker is read here; a generation
    without a record (an output written before records existed) has every marker read
    and checked. Raises ``PlanError`` (``foreign_output_message``) if partitions were
    committed under another fingerprint: resuming would mix two outputs."""
    from pipeline.output.generations import record_of_root

    fp = pipeline.fingerprint
    store = CheckpointStore(output_uri)
    record = record_of_root(output_uri)
    if record is None:
        done, foreign = store.committed(fp)
        if foreign:
            raise PlanError(foreign_output_message(output_uri, foreign, fp, pipeline.settings()))
        return Committed(store, done, done)
    ids = store.committed_ids()
    if ids and record.fingerprint != fp:
        raise PlanError(foreign_generation_message(output_uri, len(ids), record, fp,
                                                   pipeline.settings()))
    return Committed(store, ids)


def foreign_generation_message(output_uri: str, n_committed: int, record, fingerprint: str,
                               settings: dict) -> str:
    """Why a generation whose record holds another fingerprint is refused."""
    changed = _diff(record.settings, settings) if record.settings else []
    why = ("; settings changed: " + ", ".join(changed[:8])
           + (f" (and {len(changed) - 8} more)" if len(changed) > 8 else "")) if changed else ""
    return (f"{output_uri}: {n_committed} partitions were committed under another spec "
            f"fingerprint ({record.fingerprint}, generation {record.generation}; this spec has "
            f"{fingerprint}){why}. Resuming would mix two outputs: use --mode overwrite or a "
            "new output location")


def foreign_output_message(output_uri: str, foreign: dict[str, CommitMarker], fingerprint: str,
                           settings: dict) -> str:
    """Why an output committed under another fingerprint is refused: how many partitions,
    which settings differ (from the markers' ``settings``), and what to do."""
    marker = foreign[min(foreign)]
    if marker.settings:
        changed = _diff(marker.settings, settings)
        why = "; settings changed: " + ", ".join(changed[:8]) + (
            f" (and {len(changed) - 8} more)" if len(changed) > 8 else "")
    else:
        why = (f"; they were written by mmpipe {marker.mmpipe_version or '< 0.1'} (commit "
               f"marker version {marker.version}), whose fingerprint covers other settings")
    return (f"{output_uri}: {len(foreign)} partitions were committed under another spec "
            f"fingerprint ({marker.fingerprint}; this spec has {fingerprint}){why}. Resuming "
            "would mix two outputs: use --mode overwrite or a new output location")


def _diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Dotted paths where two settings trees differ, with old -> new values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in _diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]
