"""Fault injection for fault-tolerance tests; inert unless its environment variable is set.

``MMPIPE_CHAOS_KILL_WORKER_ON=p-000002,p-000007``: a ``PartitionWorker`` that is handed one
of these partitions kills its own process at once (``os._exit(137)``, as the kernel's
OOM killer would), on every attempt - a poison partition.

``MMPIPE_CHAOS_HANG_ON=p-000003``: a ``PartitionWorker`` handed one of these partitions
hangs (sleeps, never returns) on every attempt - a hung attempt, for
``runtime.attempt_timeout_s``.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)
KILL_WORKER_ON = "MMPIPE_CHAOS_KILL_WORKER_ON"
HANG_ON = "MMPIPE_CHAOS_HANG_ON"


def maybe_kill_worker(partition_id: str) -> None:
    """Exit this process if ``partition_id`` is listed in ``MMPIPE_CHAOS_KILL_WORKER_ON``."""
    if partition_id in os.environ.get(KILL_WORKER_ON, "").split(","):
        log.error("chaos: killing this worker process on partition %s", partition_id)
        os._exit(137)


def maybe_hang(partition_id: str) -> None:
    """Sleep for ever if ``partition_id`` is listed in ``MMPIPE_CHAOS_HANG_ON``."""
    if partition_id in os.environ.get(HANG_ON, "").split(","):
        log.error("chaos: hanging on partition %s", partition_id)
        while True:
            time.sleep(3600)
