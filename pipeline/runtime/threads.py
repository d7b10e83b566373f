"""Keep a PartitionWorker's CPU work within the CPUs Ray gave it.

The driver starts each PartitionWorker with ``num_cpus=1`` and as many workers as the
cluster has CPUs, so every thread pool in a worker process that sizes itself from the
machine (``os.cpu_count()``) runs N workers x N threads on N cores. ``cap_threads(cpus)``
sets, in one place, every pool the worker's code can reach:

* ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``: read when OpenMP,
  OpenBLAS, MKL or torch (intra-op threads) load in this process later. Ray sets
  ``OMP_NUM_THREADS`` to an actor's ``num_cpus`` only when it is unset in the node's
  environment; a cluster that sets it (e.g. to the node's cores) would otherwise win.
* Libraries already loaded (numpy's OpenBLAS, an OpenMP runtime): ``threadpoolctl``,
  when it is installed.
* ``OPENCV_FOR_THREADS_NUM`` (read when cv2 loads) and ``cv2.setNumThreads`` if it is
  loaded: OpenCV's ``parallel_for_`` otherwise uses every core.
* pyarrow's CPU pool (``pa.set_cpu_count``): Parquet encoding/decoding and compute
  kernels. Its default is ``OMP_NUM_THREADS`` if set when the pool is first used, else
  every core. pyarrow's I/O pool is left as it is: its threads wait on storage (S3
  parts, reads), they do not compete for CPU.
* torch, only if already imported (importing it here would cost an image-only worker a
  second and hundreds of MiB): ``torch.set_num_threads``; one imported later takes
  ``OMP_NUM_THREADS``.
* The worker's own row-step threads (``runtime.decode_threads``: decode, hash, resize,
  encode run in them and release the GIL): ``step_threads(decode_threads, cpus)``, at
  most ``cpus``. Reads keep ``decode_threads`` threads: they wait on I/O.

Pure policy plus the setters; ``assigned_cpus`` asks Ray, everything else works without it.
"""

from __future__ import annotations

import logging
import math
import os
import sys

log = logging.getLogger(__name__)

#: Environment variables read by native libraries when they load (set to the cap).
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "OPENCV_FOR_THREADS_NUM")


#: Set in a worker process of ``runtime.executors.ProcessWorkers``: the CPUs it may use.
ASSIGNED_CPUS_ENV = "MMPIPE_ASSIGNED_CPUS"


def assigned_cpus() -> int:
    """CPUs this process may use: ``MMPIPE_ASSIGNED_CPUS`` when set (a worker process of
    ``runtime.executors.ProcessWorkers``); the CPUs Ray assigned to the current actor or task
    (``get_assigned_resources``, rounded down, at least 1); outside Ray, or with none
    assigned, the CPUs this process may run on (``os.sched_getaffinity``)."""
    if os.environ.get(ASSIGNED_CPUS_ENV):  # a worker process (runtime.executors)
        return max(1, int(os.environ[ASSIGNED_CPUS_ENV]))
    cpus = None
    try:
        import ray

        if ray.is_initialized():
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - not in a Ray worker: fall back to the affinity
        cpus = None
    if not cpus:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    return max(1, math.floor(cpus))


def step_threads(decode_threads: int, cpus: int) -> int:
    """Threads for the CPU-bound row steps: ``runtime.decode_threads``, at most ``cpus``."""
    return max(1, min(decode_threads, cpus))


def cap_threads(cpus: int) -> dict[str, int]:
    """Cap this process's native thread pools at ``cpus`` threads (module docstring);
    return what was set, by pool name (for logs and tests)."""
    cpus = max(1, int(cpus))
    applied: dict[str, int] = {}
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(cpus)
        applied[var] = cpus
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(cpus)  # BLAS / OpenMP runtimes already loaded (numpy's OpenBLAS)
        applied["threadpoolctl"] = cpus
    except ImportError:
        pass
    import pyarrow as pa

    pa.set_cpu_count(cpus)
    applied["pyarrow"] = cpus
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(cpus)
        applied["cv2"] = cpus
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(cpus)
        applied["torch"] = cpus
    log.debug("thread pools capped at %d CPU%s: %s", cpus, "s"[:cpus - 1], applied)
    return applied
