"""``BatchServer``: runs one backend on a two-stage pipeline so the device never waits.

Requests (one per worker batch) go into a queue. A loader thread waits until the compute
thread can accept another batch (at most one prepared batch waits: double buffering, so
memory stays bounded), then takes the first waiting request and coalesces requests up to
``batch_size`` rows: those already queued, then those arriving until ``batch_wait_s``
after the first one arrived (Ray Serve's ``batch_wait_timeout_s`` rule; requests that
arrive while the device computes wait in the queue and fill the next batch). It runs the
backend's ``prepare`` (concatenate, pinned copy, non-blocking host-to-device copy,
tokenise); the compute thread meanwhile runs ``run`` on the previous batch under
``torch.inference_mode`` and splits the outputs back to the requests. A request is never
split: a batch may end below ``batch_size`` when the next request would overflow it, and
one request larger than ``batch_size`` is run in passes of at most ``batch_size`` rows.

On a CUDA out-of-memory error the batch is halved and retried (recursively, down to one
row), and later batches are capped at the size that worked.

Statistics (``stats()``): ``batches`` counts forward passes (``mean_batch_rows`` is what
the device sees per pass), ``requests`` worker batches. ``busy_s`` is the time the
compute thread spent in ``run``; ``window_s`` runs from the first request's arrival to the
last completion; ``busy_fraction = busy_s / window_s`` and ``idle_fraction`` (the device
waited for a batch) ``= 1 - busy_fraction``. ``queue_wait`` is the time from a request's
arrival here to the start of the forward pass that computes it; ``submit_wait`` the same
from the sender's ``_submitted_at`` (Ray transfer included; assumes synchronised clocks). No Ray here: ``runtime.model_pool`` wraps this
in a ``ModelActor``; tests and plain loops use it directly.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from pipeline.models.base import (Inputs, ModelBackend, Outputs, concat_rows, rows_of,
                                  slice_rows)

log = logging.getLogger(__name__)

SUBMITTED_AT = "_submitted_at"  # optional input key: the sender's time.time() at submit
BUSY_POLL_S = 0.001  # how often a loader holding a part-filled batch looks at the device


def _oom_types() -> tuple[type[BaseException], ...]:
    import torch

    return (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),)


def _free_device_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Request:
    __slots__ = ("inputs", "rows", "future", "arrived", "submitted")

    def __init__(self, inputs: Inputs):
        self.submitted = inputs.get(SUBMITTED_AT)
        self.inputs = {k: v for k, v in inputs.items() if not k.startswith("_")}
        self.rows = rows_of(next(iter(self.inputs.values()))) if self.inputs else 0
        self.future: Future = Future()
        self.arrived = time.time()


def merge_inputs(parts: list[Inputs]) -> Inputs:
    """Concatenate several requests' inputs row-wise (one copy for arrays)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        out[key] = (np.concatenate(values) if isinstance(values[0], np.ndarray)
                    else [v for part in values for v in part])
    return out


class BatchServer:
    """Serve ``backend`` with coalescing up to ``batch_size`` rows per forward pass.

    ``submit(inputs) -> Future`` of the outputs for exactly those rows; ``__call__`` is
    ``submit(...).result()``. ``on_batch(rows, busy_s, queue_waits_s)`` (optional) is called
    after each forward pass, e.g. to export metrics.
    """

    def __init__(self, backend: ModelBackend, batch_size: int,
                 on_batch: Callable[[int, float, list[float]], None] | None = None,
                 batch_wait_s: float = 0.0):
        self.backend, self.batch_size, self.on_batch = backend, batch_size, on_batch
        self.batch_wait_s = batch_wait_s
        self.max_rows = batch_size  # lowered after a CUDA OOM
        self.requests: queue.Queue[_Request] = queue.Queue()
        self.prepared: queue.Queue = queue.Queue()
        self._slot = threading.Semaphore(1)  # free while no prepared batch waits
        self._held: _Request | None = None  # taken but did not fit the last batch
        self._computing = threading.Event()  # set while the compute thread runs a batch
        self._lock = threading.Lock()
        self._stats: dict[str, Any] = {
            "batches": 0, "requests": 0, "records": 0, "busy_s": 0.0, "prepare_s": 0.0,
            "queue_wait_s": 0.0, "queue_wait_max_s": 0.0, "submit_wait_s": 0.0,
            "submit_waits": 0, "oom_splits": 0, "errors": 0, "first_arrival": None,
            "last_done": None}
        for target, name in ((self._load_loop, "loader"), (self._compute_loop, "compute")):
            threading.Thread(target=target, name=f"model-{name}", daemon=True).start()

    def submit(self, inputs: Inputs) -> Future:
        req = _Request(inputs)
        if req.rows == 0:
            req.future.set_result({f.name: [] for f in self.backend.info.outputs})
            return req.future
        with self._lock:
            if self._stats["first_arrival"] is None:
                self._stats["first_arrival"] = req.arrived
        self.requests.put(req)
        return req.future

    def __call__(self, inputs: Inputs) -> Outputs:
        return self.submit(inputs).result()

    def _take(self) -> list[_Request]:
        """The next batch: the first request, then more until ``batch_size`` rows, or
        until ``batch_wait_s`` after the first one's arrival has passed and the compute
        thread is idle (while it computes, waiting costs the device nothing); a request
        that would overflow the batch is held for the next one."""
        first, self._held = self._held or self.requests.get(), None
        batch, rows = [first], first.rows
        deadline = first.arrived + self.batch_wait_s
        while rows < self.batch_size:
            timeout = deadline - time.time()
            if timeout <= 0:
                if not self._computing.is_set():
                    timeout = 0.0
                else:  # look again shortly: the device may finish before a request comes
                    timeout = BUSY_POLL_S
            try:
                req = self.requests.get(timeout=timeout)
            except queue.Empty:
                if timeout == 0.0:
                    break
                continue
            if rows + req.rows > self.batch_size:
                self._held = req
                break
            batch.append(req)
            rows += req.rows
        return batch

    def _load_loop(self) -> None:
        while True:
            self._slot.acquire()  # released when the compute thread takes a batch
            batch = self._take()
            t0 = time.time()
            try:
                prepared = self.backend.prepare(merge_inputs([r.inputs for r in batch]))
            except BaseException as e:  # noqa: BLE001 - returned to the requests' senders
                self._slot.release()
                self._fail(batch, e)
                continue
            with self._lock:
                self._stats["prepare_s"] += time.time() - t0
            self.prepared.put((batch, prepared))

    def _compute_loop(self) -> None:
        import torch

        while True:
            batch, prepared = self.prepared.get()
            self._computing.set()
            self._slot.release()
            waits = self._record_wait(batch, time.time())
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    out, passes = self._run_capped(prepared)
            except BaseException as e:  # noqa: BLE001 - returned to the requests' senders
                self._fail(batch, e)
                continue
            finally:
                self._computing.clear()
            busy = time.perf_counter() - t0
            self._record_done(batch, sum(r.rows for r in batch), busy, passes, waits)
            start = 0  # stats first: a caller that has its result sees them counted
            for req in batch:
                req.future.set_result(slice_rows(out, start, start + req.rows))
                start += req.rows

    def _run_capped(self, prepared: dict[str, Any]) -> tuple[Outputs, int]:
        """Run in forward passes of at most ``max_rows`` rows; return outputs and passes."""
        n = max(rows_of(v) for k, v in prepared.items() if not k.startswith("_"))
        cap = self.max_rows
        parts = [self.run_splitting_on_oom(slice_rows(prepared, i, min(n, i + cap)))
                 for i in range(0, n, cap)]
        return concat_rows(parts), len(parts)

    def run_splitting_on_oom(self, prepared: dict[str, Any]) -> Outputs:
        """``backend.run(prepared)``; on CUDA OOM halve the batch and retry each half."""
        n = max(rows_of(v) for k, v in prepared.items() if not k.startswith("_"))
        try:
            return self.backend.run(prepared)
        except _oom_types():
            if n <= 1:
                raise
            _free_device_memory()
            half = n // 2
            with self._lock:
                self._stats["oom_splits"] += 1
                self.max_rows = min(self.max_rows, half)
            log.warning("CUDA out of memory on a batch of %d rows; retrying as %d + %d",
                        n, half, n - half)
            return concat_rows([self.run_splitting_on_oom(slice_rows(prepared, 0, half)),
                                self.run_splitting_on_oom(slice_rows(prepared, half, n))])

    def _fail(self, batch: list[_Request], error: BaseException) -> None:
        log.error("model batch of %d requests failed: %r", len(batch), error)
        with self._lock:
            self._stats["errors"] += 1
        for req in batch:
            req.future.set_exception(error)

    def _record_wait(self, batch: list[_Request], t0: float) -> list[float]:
        """Account each request's queue wait (arrival to compute start); return them."""
        waits = [t0 - req.arrived for req in batch]
        with self._lock:
            s = self._stats
            for req, wait in zip(batch, waits):
                s["queue_wait_s"] += wait
                s["queue_wait_max_s"] = max(s["queue_wait_max_s"], wait)
                if req.submitted is not None:
                    s["submit_wait_s"] += max(0.0, t0 - req.submitted)
                    s["submit_waits"] += 1

    def _record_done(self, batch: list[_Request], rows: int, busy: float, passes: int,
                     waits: list[float]) -> None:
        with self._lock:
            s = self._stats
            s["batches"] += passes
            s["requests"] += len(batch)
            s["records"] += rows
            s["busy_s"] += busy
            s["last_done"] = time.time()
        if self.on_batch is not None:
            self.on_batch(rows, busy, waits)

    def stats(self) -> dict[str, Any]:
        """Counters and derived rates (see the module docstring)."""
        with self._lock:
            s = dict(self._stats)
        window = (s["last_done"] - s["first_arrival"]) if s["last_done"] else 0.0
        busy_fraction = min(1.0, s["busy_s"] / window) if window > 0 else 0.0
        out = {k: v for k, v in s.items() if k not in ("first_arrival", "last_done",
                                                        "submit_waits", "submit_wait_s",
                                                        "queue_wait_s")}
        out.update(
            window_s=round(window, 3), busy_s=round(s["busy_s"], 3),
            prepare_s=round(s["prepare_s"], 3),
            busy_fraction=round(busy_fraction, 4),
            idle_fraction=round(1 - busy_fraction, 4) if window > 0 else None,
            records_per_s=round(s["records"] / window, 2) if window > 0 else 0.0,
            records_per_busy_s=round(s["records"] / s["busy_s"], 2) if s["busy_s"] else 0.0,
            mean_batch_rows=round(s["records"] / s["batches"], 1) if s["batches"] else 0.0,
            queue_wait_mean_s=round(s["queue_wait_s"] / s["requests"], 4) if s["requests"] else 0.0,
            queue_wait_max_s=round(s["queue_wait_max_s"], 4),
            submit_wait_mean_s=(round(s["submit_wait_s"] / s["submit_waits"], 4)
                                if s["submit_waits"] else None),
            max_rows=self.max_rows)
        return out


def server_stats(server: BatchServer, name: str, section: str, load_s: float,
                 started: float) -> dict[str, Any]:
    """One model replica's statistics for the job report: the server's ``stats()``, its
    backend's media counters and who it is (``name``, ``section``, backend, description),
    ``load_s`` (seconds to load it) and ``alive_s`` (since ``started``, a ``time.time()``)."""
    backend = server.backend
    return dict(server.stats(), **backend.media_stats(), name=name, model=section,
                backend=backend.info.backend, description=backend.info.description,
                load_s=round(load_s, 2), alive_s=round(time.time() - started, 2))
