"""A PartitionWorker's private temporary directory, and the removal of dead workers' ones.

Attempts stage files on local disk (videos and shards copied from object storage, spooled
downloads: ``mmpipe-stage-*``). They are deleted when the attempt is done with them, but a
worker that is killed (OOM, ``ray.kill`` after ``attempt_timeout_s``, a lost node) leaves
them behind. So each worker stages into a directory of its own, ``mmpipe-worker-<random>``
under the staging base (``video.temp_dir``, else the system temp dir), and holds an
exclusive ``flock`` on its ``.lock`` file for as long as its process lives. A starting
worker first removes every such directory whose lock it can take: its owner is dead (the
kernel drops a dead process's locks), so what is there is stale.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "mmpipe-worker-"
_LOCK = ".lock"


class Scratch:
    """This process's staging directory ``path``, locked while the object lives."""

    def __init__(self, base: str | None = None):
        self.base = Path(base or tempfile.gettempdir())
        self.base.mkdir(parents=True, exist_ok=True)
        self.removed = remove_stale(self.base)
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=self.base))
        self._fd = os.open(self.path / _LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)


def remove_stale(base: Path) -> list[str]:
    """Delete the ``mmpipe-worker-*`` directories under ``base`` whose lock no live process
    holds; return their names. Directories of live workers (and any without a lock file:
    one being made right now) are left alone; errors while deleting are logged."""
    removed = []
    for d in sorted(base.glob(PREFIX + "*")):
        try:
            fd = os.open(d / _LOCK, os.O_WRONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(d)
            removed.append(d.name)
        except OSError as e:
            log.warning("cannot remove the stale staging directory %s: %s", d, e)
        finally:
            os.close(fd)
    if removed:
        log.info("removed %d staging director%s of dead workers under %s", len(removed),
                 "y" if len(removed) == 1 else "ies", base)
    return removed


def claim(video_temp_dir: str | None) -> Scratch:
    """Clean up after dead workers, then make this process stage into a fresh locked
    directory: ``tempfile.tempdir`` points there (every ``mkstemp`` without ``dir``).
    ``video_temp_dir`` (``video.temp_dir``) is the base if set; the caller passes
    ``Scratch.path`` on as the job's ``video.temp_dir`` in that case."""
    scratch = Scratch(video_temp_dir)
    tempfile.tempdir = str(scratch.path)
    return scratch
