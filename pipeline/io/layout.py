"""``OutputLayout``: every path inside a job's output, owned in one place.

```
<output>/
  _plan/plan.parquet, _plan/partitions.parquet     the PartitionPlan (written once)
  _checkpoints/<pid>.json                          commit markers
  _failures/<pid>.json                             last error of a failed partition
  _SUCCESS                                         the JobReport, once complete
  data/<pid>/a-<attempt>/part-00000.parquet        data rows (every status)
  quarantine/<pid>/a-<attempt>/part-00000.parquet  error rows with their source bytes
  wds/<pid>/a-<attempt>/<pid>-000000.tar           WebDataset shards of ok rows
  _index/<kind>/b-<bucket>/<pid>.a-<attempt>.parquet  dedup hash index (pipeline.dedup.index)
  _dedup/                                          the dedup pass (pipeline.dedup.store)
  _leases/<pid>.<attempt>.json                     a running attempt's lease (pipeline.io.lease)
```

This is the layout of one generation (``pipeline.io.generations``): generation 1 at the
output root, later ones (``--mode overwrite``) under ``_generations/g-<n>/``. An
``OutputLayout`` is built on a generation root.

Attempt files live under attempt-unique directories, so attempts never overwrite each
other; a commit marker names the files (relative to the output root) that are output.
The datasinks, the checkpoint store, the planner, ``mmpipe status``/``gc`` and the
readers of committed output all take their paths from here.
"""

from __future__ import annotations

import posixpath

from pipeline.io import fs

PLAN_FILE = "_plan/plan.parquet"
PLAN_INDEX_FILE = "_plan/partitions.parquet"
CHECKPOINT_DIR = "_checkpoints"
FAILURE_DIR = "_failures"
SUCCESS_FILE = "_SUCCESS"
#: Top-level directories of attempt files, by datasink name.
ATTEMPT_ROOTS = {"parquet": "data", "quarantine": "quarantine", "webdataset": "wds",
                 "index": "_index"}


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
        """``data/<pid>/a-<attempt>`` (``sink``: a key of ``ATTEMPT_ROOTS``)."""
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
        return rel.startswith(ATTEMPT_ROOTS["parquet"] + "/")

    def attempt_roots(self) -> list[str]:
        """URIs of the directories holding attempt files (what ``gc`` lists)."""
        return [self.uri(top) for top in ATTEMPT_ROOTS.values()]
