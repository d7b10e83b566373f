"""run_partition without Ray: bounded model batches in flight, streaming row groups."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from pipeline.models.local import LocalModelClient, local_models
from tests.conftest import REPO


class CountingClient(LocalModelClient):
    """The real embedder, counting batches submitted but not yet collected."""

    def __init__(self, server):
        super().__init__(server)
        self.outstanding = self.max_outstanding = self.batches = 0

    def submit(self, inputs):
        self.outstanding += 1
        self.batches += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        return super().submit(inputs)

    def result(self, handle):
        self.outstanding -= 1
        return super().result(handle)


def test_model_batches_in_flight_are_bounded_and_row_groups_stream(tmp_path):
    spec = JobSpec.model_validate({
        "source": {"kind": "manifest", "uri": str(REPO / "data/photos/captions.jsonl"),
                   "path_column": "file", "caption_column": "captions", "key_column": "key",
                   "partition_size": 20},
        "sink": {"uri": str(tmp_path / "out"), "rows_per_row_group": 4},
        "runtime": {"batch_size": 2}, "text_embedding": {"max_in_flight": 3}})
    pool = ThreadPoolExecutor(2)
    models = local_models(spec, batch_server=False, client=CountingClient)
    client = models["text_embedding"][0]
    pipeline = assemble(spec, models, pool, setup=True)
    part = next(planning.pack(pipeline.datasource.list_inputs(), spec.source.partition_size))
    out = run_partition(pipeline, part, "cafe", pool)
    assert out.committed and out.marker.rows_in == 20
    assert client.batches == 10 and client.max_outstanding == 3 and client.outstanding == 0
    meta = pq.ParquetFile(tmp_path / "out" / out.marker.files[0]).metadata
    assert meta.num_row_groups == 5 and meta.num_rows == 20
    table = pq.read_table(tmp_path / "out" / out.marker.files[0])
    vecs = np.stack(table.column("text_embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # row order is the plan's order: results came back to the rows that sent them
    captions = table.column("caption").to_pylist()
    np.testing.assert_allclose(vecs, client.server({"text": captions})["text_embedding"],
                               atol=1e-5)
