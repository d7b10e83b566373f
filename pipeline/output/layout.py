"""``OutputLayout``: every path inside a job's output, owned in one place.

```
<output>/
  _plan/plan.parquet, _plan/partitions.parquet     the PartitionPlan (written once)
  _plan/extension-0001.parquet, .json              an append's new partitions and record
  _checkpoints/<pid>.json                          commit markers
  _failures/<pid>.json                             last error of a failed partition
  _SUCCESS                                         the JobReport, once complete
  data/<pid>/a-<attempt>/part-00000.parquet        data rows (every status)
  quarantine/<pid>/a-<attempt>/part-00000.parquet  error rows with their source bytes
  wds/<pid>/a-<attempt>/<pid>-000000.tar           WebDataset shards of ok rows
  _index/<kind>/b-<bucket>/<pid>.a-<attempt>.parquet  dedup hash index (pipeline.dedup.index)
  _dedup/                                          the dedup pass (pipeline.dedup.store)
  _leases/<pid>.<attempt>.json                     a running attempt's lease (pipeline.output.lease)
  quarantine/_delta_log/                           the generation's quarantine table (output.table)
```

Beside the generations, at the output root only: ``_calibration/<name>/calibration.json``
and ``calibration.png`` (``mmpipe calibrate``, ``pipeline.calibration``), and the data
table's log ``_delta_log/`` (``pipeline.output.table``). They are mmpipe's names
(``owned``) but no generation's entry (not in ``root_entries``): gc and ``--mode
overwrite`` never list them, so calibrations and the table survive both. A generation's
quarantine table (``quarantine/_delta_log/``) is that generation's: deleted with it.

This is the layout of one generation (``pipeline.output.generations``): generation 1 at the
output root, later ones (``--mode overwrite``) under ``_generations/g-<n>/``. An
``OutputLayout`` is built on a generation root.

Attempt files live under attempt-unique directories, so attempts never overwrite each
other; a commit marker names the files (relative to the output root) that are output.
The datasinks, the checkpoint store, the planner, ``mmpipe status``/``gc``/``ls`` and the
readers of committed output all take their paths from here: a datasink's directory is
registered once (``register_attempt_root``, which ``Datasink`` subclasses do by setting
``directory``), and every list of directories (``root_entries``, ``attempt_of``,
``attempt_root_names``) is derived from the registry when it is asked, never copied.

What mmpipe may delete is named here too (``owned``, ``owned_files``): attempt files
(``<root>/<pid>/a-<attempt>/...``, ``_index/<kind>/b-<n>/<pid>.a-<attempt>.parquet``) and
the files of its fixed entries, listed without following symbolic links and without
entering a nested output (a folder holding ``_plan``/``_checkpoints``/``_SUCCESS``/...).
A user's ``data/labels.csv`` beside an output is never a candidate for gc or overwrite.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat

from pipeline.storage import fs

PLAN_DIR = "_plan"
PLAN_FILE = f"{PLAN_DIR}/plan.parquet"
PLAN_INDEX_FILE = f"{PLAN_DIR}/partitions.parquet"
CHECKPOINT_DIR = "_checkpoints"
FAILURE_DIR = "_failures"
SUCCESS_FILE = "_SUCCESS"
ATTEMPT_LEASE_DIR = "_leases"
DEDUP_DIR = "_dedup"
#: Where generations after the first live (``pipeline.output.generations``).
GEN_DIR = "_generations"
JOB_LEASE_DIR = "_job"
#: Threshold calibrations of the output (``pipeline.calibration``): not a generation's.
CALIBRATION_DIR = "_calibration"
#: A Delta table's log (``pipeline.output.table``): the data table's at the output root
#: (the output's, no generation's), the quarantine table's under a generation's quarantine
#: directory (that generation's).
DELTA_LOG = "_delta_log"
#: The dedup hash index's attempt root (its files are ``<pid>.a-<attempt>.parquet`` under
#: ``_index/<kind>/b-<bucket>/``, not under an attempt directory).
INDEX_DIR = "_index"
#: Top-level directories of attempt files, by datasink name (filled by
#: ``register_attempt_root``: the built-in ones below, a new datasink's when its class is
#: defined).
ATTEMPT_ROOTS: dict[str, str] = {}
#: Root entries that are not attempt roots (owned by a generation).
_FIXED_ENTRIES = (SUCCESS_FILE, CHECKPOINT_DIR, FAILURE_DIR, ATTEMPT_LEASE_DIR, PLAN_DIR,
                  DEDUP_DIR)
_DIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$|^_index$")


def register_attempt_root(sink: str, directory: str) -> None:
    """Register datasink ``sink``'s top-level attempt directory (``data``, ``wds``, ...).

    Idempotent for the same pair. Raises ``ValueError`` for an empty or nested name, a
    name of a fixed entry (``_checkpoints``, ``_plan``, ...), or a directory or datasink
    name already registered to another."""
    if not sink or not _DIR_NAME.match(directory or "") or directory in _FIXED_ENTRIES + (
            GEN_DIR, JOB_LEASE_DIR, CALIBRATION_DIR, DELTA_LOG):
        raise ValueError(f"datasink {sink!r}: directory {directory!r} is not a free top-level "
                         "name of an output")
    if ATTEMPT_ROOTS.get(sink, directory) != directory:
        raise ValueError(f"datasink {sink!r} already writes to {ATTEMPT_ROOTS[sink]!r}")
    owner = next((s for s, d in ATTEMPT_ROOTS.items() if d == directory and s != sink), None)
    if owner is not None:
        raise ValueError(f"datasink {sink!r}: directory {directory!r} belongs to {owner!r}")
    ATTEMPT_ROOTS[sink] = directory


#: The built-in datasinks' directories (a new datasink registers its own by setting
#: ``Datasink.directory``).
for _sink, _directory in (("parquet", "data"), ("quarantine", "quarantine"),
                          ("webdataset", "wds"), ("index", INDEX_DIR)):
    register_attempt_root(_sink, _directory)


def attempt_root_names(extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The attempt directories: every registered one plus ``extra`` (those a generation
    record names), sorted."""
    return sorted(set(ATTEMPT_ROOTS.values()) | set(extra))


def root_entries(extra: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
    """What one generation owns at its root (what deleting generation 1 deletes, and
    nothing else): the fixed entries plus ``attempt_root_names(extra)``."""
    return _FIXED_ENTRIES + tuple(attempt_root_names(extra))


_PID = r"p-\d{6,}"                               # records.partition_name
_ATTEMPT = r"[A-Za-z0-9][A-Za-z0-9_-]*"           # a random id (no dots: lease names)
_ATTEMPT_FILE = re.compile(rf"^({_PID})/a-({_ATTEMPT})/[^/].*$")
_INDEX_FILE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_-]*/b-\d+/({_PID})\.a-({_ATTEMPT})\.parquet$")
_TMP = r"(\.tmp-[0-9a-f]+)?"
#: Files of the fixed entries, by entry (relative to the entry; what deleting a
#: generation deletes there, and nothing else).
_FIXED_FILES = {
    PLAN_DIR: re.compile(rf"^(plan|partitions)\.parquet{_TMP}$"),
    CHECKPOINT_DIR: re.compile(rf"^{_PID}\.json{_TMP}$"),
    FAILURE_DIR: re.compile(rf"^{_PID}\.json{_TMP}$"),
    ATTEMPT_LEASE_DIR: re.compile(rf"^{_PID}\.{_ATTEMPT}\.json{_TMP}$"),
}
_CALIBRATION_FILE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]*/calibration\.(json|png){_TMP}$")
#: Names that make a directory an output root of its own: a directory below a generation
#: root holding one of them is a nested output, never entered (``owned_files``).
OUTPUT_MARKERS = (PLAN_DIR, CHECKPOINT_DIR, SUCCESS_FILE, GEN_DIR, JOB_LEASE_DIR)


def attempt_of(rel: str, extra: tuple[str, ...] | list[str] = ()) -> tuple[str, str] | None:
    """``(partition id, attempt id)`` of an attempt file (path relative to its generation
    root): ``<root>/<pid>/a-<attempt>/<file>`` for an attempt root of
    ``attempt_root_names(extra)``, or ``_index/<kind>/b-<bucket>/<pid>.a-<attempt>.parquet``;
    None for any other name (a file mmpipe never wrote: ``data/labels.csv``). ``pid`` is
    ``p-`` and at least six digits (``records.partition_name``), ``attempt`` letters,
    digits, ``_`` and ``-``."""
    top, _, rest = rel.partition("/")
    if top == INDEX_DIR:
        m = _INDEX_FILE.match(rest)
    elif top in attempt_root_names(extra):
        m = _ATTEMPT_FILE.match(rest)
    else:
        return None
    return (m.group(1), m.group(2)) if m else None


def owned(rel: str, extra: tuple[str, ...] | list[str] = ()) -> bool:
    """True if ``rel`` (a file path relative to a generation root) is a name of mmpipe's
    own layout: ``_SUCCESS``; a plan file, commit marker, failure record or attempt lease
    (and their ``.tmp-<hex>`` files); an attempt file (``attempt_of``); anything under
    ``_dedup/`` (the dedup pass's own layout, ``pipeline.dedup.store``); a calibration's
    ``_calibration/<name>/calibration.json|png``; a Delta log (``_delta_log/...`` at the
    root, ``quarantine/_delta_log/...``: ``pipeline.output.table``). What gc and the
    deletion of a generation may delete, of the entries they list (``root_entries``:
    ``_calibration/`` and the root ``_delta_log/`` are none of them, so they are never
    deleted; a generation's quarantine table goes with it; gc deletes attempt files
    only); a user's ``data/labels.csv`` is not owned."""
    if rel == SUCCESS_FILE:
        return True
    top, _, rest = rel.partition("/")
    if top in _FIXED_FILES:
        return bool(_FIXED_FILES[top].match(rest))
    if top == DEDUP_DIR:
        return bool(rest) and not rest.startswith("/")
    if top == CALIBRATION_DIR:
        return bool(_CALIBRATION_FILE.match(rest))
    if top == DELTA_LOG or (top == ATTEMPT_ROOTS.get("quarantine") and
                            rest.startswith(DELTA_LOG + "/")):
        return bool(rest) and not rest.startswith("/")
    return attempt_of(rel, extra) is not None


def _nested_roots(rels: list[str]) -> set[str]:
    """Directories (relative, below the generation root, outside ``_dedup/``) that hold an
    ``OUTPUT_MARKERS`` entry: roots of nested outputs."""
    roots = set()
    for rel in rels:
        parts = rel.split("/")
        if parts[0] == DEDUP_DIR:
            continue
        for i in range(1, len(parts)):
            if parts[i] in OUTPUT_MARKERS:
                roots.add("/".join(parts[:i]))
    return roots


def _walk_no_links(top: str) -> list[fs.FileEntry]:
    """Every regular file under the local directory ``top``, never following a symbolic
    link (a link to a file or a directory is skipped, as is ``top`` itself if it is one);
    unsorted; what vanishes while it walks (an attempt deleting its files) is skipped.
    Raises ``OSError`` if a directory cannot be read."""
    root = fs.uri_to_bytes(top)
    try:
        st = os.lstat(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not stat.S_ISDIR(st.st_mode):
        return []
    out: list[fs.FileEntry] = []
    stack = [root]
    while stack:
        try:
            found = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in found:
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(est.st_mode):
                stack.append(entry.path)
            elif stat.S_ISREG(est.st_mode):
                out.append(fs.FileEntry(fs.uri_from_bytes(entry.path), est.st_size,
                                        est.st_mtime))
    return out


def _is_plain_file(uri: str) -> bool:
    """True if a regular file (locally: not a symbolic link) is at ``uri``."""
    if not fs.is_local(uri):
        return fs.file_size(uri) is not None
    try:
        return stat.S_ISREG(os.lstat(fs.uri_to_bytes(uri)).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def owned_files(root: str, extra: tuple[str, ...] | list[str] = (),
                tops: tuple[str, ...] | list[str] | None = None) -> list[fs.FileEntry]:
    """The files of mmpipe's own layout under the generation root ``root`` (``owned``),
    sorted by URI: one listing per entry of ``tops`` (default ``root_entries(extra)``).
    A local listing never follows a symbolic link (``data/x -> /elsewhere`` is not
    entered, a linked file is not listed); a directory holding an output's own entries
    (``OUTPUT_MARKERS``: a nested output) is never entered, on S3 too. Raises
    ``StorageError``/``OSError`` if the store fails."""
    root = fs.normalize(root)
    prefix = root.rstrip("/") + "/"
    found: list[tuple[str, fs.FileEntry]] = []
    for top in (root_entries(extra) if tops is None else tops):
        uri = fs.join(root, top)
        if top == SUCCESS_FILE:
            entries = [fs.FileEntry(uri, 0)] if _is_plain_file(uri) else []
        else:
            entries = _walk_no_links(uri) if fs.is_local(uri) else fs.list_files(uri)
        found += [(e.uri[len(prefix):], e) for e in entries if e.uri.startswith(prefix)]
    nested = _nested_roots([rel for rel, _ in found])
    return sorted((e for rel, e in found if owned(rel, extra)
                   and not any(rel.startswith(n + "/") for n in nested)),
                  key=lambda e: e.uri)


def is_output(output_uri: str) -> bool:
    """True if ``output_uri`` (local path or ``s3://``) holds an mmpipe output: a file
    under ``_plan/`` or ``_checkpoints/``, or a generation (``_generations/``). Raises
    ``StorageError`` if the store fails."""
    layout = OutputLayout(output_uri)
    return any(next(iter(fs.list_files(layout.uri(top))), None) is not None
               for top in (PLAN_DIR, CHECKPOINT_DIR, GEN_DIR))


class OutputLayout:
    """Paths of one output root (a local path or ``s3://bucket/prefix``).

    Relative paths (``rel_*``) are what commit markers store; ``uri(rel)`` makes them
    absolute. The root is normalised (a relative local path becomes absolute), so paths
    compare equal to those a listing returns.
    """

    def __init__(self, root: str):
        self.root = fs.normalize(root)

    def uri(self, rel: str) -> str:
        """Absolute URI of a path relative to the root."""
        return fs.join(self.root, rel)

    # --- plan, markers, failures, success ---------------------------------------------
    @property
    def plan(self) -> str:
        return self.uri(PLAN_FILE)

    @property
    def plan_index(self) -> str:
        return self.uri(PLAN_INDEX_FILE)

    def plan_extension(self, number: int, suffix: str) -> str:
        """``_plan/extension-0001.<suffix>`` of extension ``number`` (``parquet``: its
        plan rows; ``json``: its record, ``pipeline.output.plan.extend``)."""
        return self.uri(f"{PLAN_DIR}/extension-{number:04d}.{suffix}")

    @property
    def checkpoints(self) -> str:
        return self.uri(CHECKPOINT_DIR)

    def marker(self, partition_id: str) -> str:
        return self.uri(f"{CHECKPOINT_DIR}/{partition_id}.json")

    @property
    def failures(self) -> str:
        return self.uri(FAILURE_DIR)

    def failure(self, partition_id: str) -> str:
        return self.uri(f"{FAILURE_DIR}/{partition_id}.json")

    @property
    def success(self) -> str:
        return self.uri(SUCCESS_FILE)

    @staticmethod
    def partition_of_json(uri: str) -> str | None:
        """``p-000042`` for ``.../_checkpoints/p-000042.json``; None for anything else
        (a temporary file of an exclusive create, a stray name)."""
        name = posixpath.basename(uri)
        if not name.endswith(".json") or ".tmp-" in name:
            return None
        return name[:-len(".json")]

    # --- attempt files ----------------------------------------------------------------
    @staticmethod
    def rel_attempt_dir(sink: str, partition_id: str, attempt_id: str) -> str:
        """``data/<pid>/a-<attempt>`` (``sink``: a key of ``ATTEMPT_ROOTS``). Raises
        ``KeyError`` naming the datasink if it registered no directory."""
        if sink not in ATTEMPT_ROOTS:
            raise KeyError(f"datasink {sink!r} has no attempt directory: set its `directory` "
                           f"(registered: {sorted(ATTEMPT_ROOTS)})")
        return f"{ATTEMPT_ROOTS[sink]}/{partition_id}/a-{attempt_id}"

    @classmethod
    def rel_parquet(cls, sink: str, partition_id: str, attempt_id: str, index: int = 0) -> str:
        """``data/<pid>/a-<attempt>/part-00000.parquet`` (or under ``quarantine/``)."""
        return f"{cls.rel_attempt_dir(sink, partition_id, attempt_id)}/part-{index:05d}.parquet"

    @classmethod
    def rel_shard(cls, partition_id: str, attempt_id: str, index: int) -> str:
        """``wds/<pid>/a-<attempt>/<pid>-000000.tar``."""
        return (f"{cls.rel_attempt_dir('webdataset', partition_id, attempt_id)}/"
                f"{partition_id}-{index:06d}.tar")

    @staticmethod
    def is_data_file(rel: str) -> bool:
        """True for a Parquet data file (what readers of the output read)."""
        return rel.startswith(ATTEMPT_ROOTS.get("parquet", "data") + "/")

    def attempt_roots(self, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
        """URIs of the directories holding attempt files (what ``gc`` lists):
        ``attempt_root_names(extra)``."""
        return [self.uri(top) for top in attempt_root_names(extra)]
