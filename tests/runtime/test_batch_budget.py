"""Decoded pixels per batch are bounded by ``runtime.max_batch_bytes``, not a row count.

The reproduction of issue 12: eight small PNGs that each decode to a huge image made one
batch of eight hold every decoded array at once (3.6 GiB). Here eight ~35 KB PNGs decode
to 4000x3000 (36 MB of pixels each, 288 MB together); with a 64 MiB budget the numpy
arrays alive at once (tracemalloc counts numpy's buffers) stay near one image.
"""

from __future__ import annotations

import tracemalloc
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.runtime.budget import cut_batch
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from pipeline.media.decode import decoded_size

W, H = 4000, 3000
MIB = 2**20


def _huge_pngs(root, n=8):
    root.mkdir()
    for k in range(n):
        Image.new("RGB", (W, H), (10 * k, 100, 200)).save(root / f"big-{k}.png",
                                                          compress_level=9)
    return root


def _spec(src, out, max_batch_bytes):
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(src), "partition_size": 8},
        "sink": {"uri": str(out), "quarantine": False},
        "text_embedding": {"enabled": False}, "dedup": {"exact": False, "near": False},
        "runtime": {"batch_size": 8, "decode_threads": 2, "max_batch_bytes": max_batch_bytes}})


def test_header_estimate_is_the_decoded_array_size(tmp_path):
    png = _huge_pngs(tmp_path / "in", 1) / "big-0.png"
    assert png.stat().st_size < 300_000
    assert decoded_size(png.read_bytes()) == W * H * 3
    assert decoded_size(b"not an image") == 0


def test_a_batch_of_huge_pngs_is_cut_by_the_byte_budget(tmp_path):
    src = _huge_pngs(tmp_path / "in")
    spec = _spec(src, tmp_path / "out", 64 * MIB)
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, None, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), spec.source.partition_size))
    tracemalloc.start()
    try:
        out = run_partition(pipeline, part, "feed", pool)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        pool.shutdown()
    s = out.marker.rows_by_status
    assert out.committed and out.marker.rows_in == 8 == s["ok"] + s["rejected"] + s["error"]
    assert s["ok"] == 8
    # eight decoded arrays at once would be 288 MB; one or two (a thread each) fit here
    assert peak < 2 * W * H * 3 + 40 * MIB, f"peak {peak / MIB:.0f} MiB"


def test_cut_batch_keeps_order_and_puts_an_oversized_row_alone():
    from pipeline.steps.base import Step

    class Sized(Step):
        def decoded_bytes(self, batch, i):
            return batch["size"][i]

    batch = {"status": ["ok"] * 5 + ["error"], "size": [40, 40, 100, 10, 10, 999]}
    parts = list(cut_batch(batch, [Sized()], 64))
    assert [p["size"] for p in parts] == [[40], [40], [100], [10, 10, 999]]
    assert list(cut_batch(batch, [Sized()], 10**6)) == [batch]
