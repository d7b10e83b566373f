"""Fault injection for fault-tolerance tests; inert unless its environment variable is set.

``MMPIPE_CHAOS_KILL_WORKER_ON=p-000002,p-000007``: a ``PartitionWorker`` that is handed one
of these partitions kills its own process at once (``os._exit(137)``, as the kernel's
OOM killer would), on every attempt - a poison partition.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
KILL_WORKER_ON = "MMPIPE_CHAOS_KILL_WORKER_ON"


def maybe_kill_worker(partition_id: str) -> None:
    """Exit this process if ``partition_id`` is listed in ``MMPIPE_CHAOS_KILL_WORKER_ON``."""
    if partition_id in os.environ.get(KILL_WORKER_ON, "").split(","):
        log.error("chaos: killing this worker process on partition %s", partition_id)
        os._exit(137)
