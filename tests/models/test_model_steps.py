"""The model-step mechanism of a partition without Ray: stages, the score gate, bounds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from pipeline.models.local import LocalModelClient, local_models
from tests.conftest import REPO, coco_captions


class Counting(LocalModelClient):
    def __init__(self, server):
        super().__init__(server)
        self.outstanding = self.max_outstanding = self.rows = 0

    def submit(self, inputs):
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        self.rows += len(next(iter(inputs.values())))
        return super().submit(inputs)

    def result(self, handle):
        self.outstanding -= 1
        return super().result(handle)


def test_captions_only_for_rows_that_pass_the_score_filter_in_input_order(tiny_models, tmp_path):
    spec = JobSpec.model_validate({
        "source": {"kind": "manifest", "uri": str(REPO / "data/photos/captions.jsonl"),
                   "path_column": "file", "caption_column": "captions", "key_column": "key",
                   "partition_size": 20},
        "sink": {"uri": str(tmp_path / "out"), "rows_per_row_group": 4},
        "runtime": {"batch_size": 4},
        "text_embedding": {"enabled": False},
        "image_embedding": {"enabled": True, "model": str(tiny_models["tiny-clip"]),
                            "min_clip_score": 0.0, "max_in_flight": 3},
        "captioning": {"enabled": True, "model": str(tiny_models["tiny-blip"]),
                       "max_new_tokens": 5, "max_in_flight": 3}})
    models = local_models(spec, client=Counting)
    clients = {s: c for s, (c, _) in models.items()}
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, models, pool, setup=True)
    assert [[t.section for t in stage] for stage in pipeline.models.stages] == [
        ["image_embedding"], ["captioning"]]
    part = next(planning.pack(pipeline.datasource.list_inputs(), spec.source.partition_size))
    out = run_partition(pipeline, part, "beef", pool).marker
    assert out.rows_in == 20
    s = out.rows_by_status
    assert s["ok"] + s["rejected"] + s["error"] == 20 and s["rejected"] > 0 and s["ok"] > 0
    assert out.rows_by_reason == {"rejected:low_clip_score": s["rejected"]}
    assert clients["image_embedding"].rows == 20 and clients["captioning"].rows == s["ok"]
    assert all(c.outstanding == 0 and 1 <= c.max_outstanding <= 3 for c in clients.values())
    rows = pq.read_table(tmp_path / "out" / out.files[0]).to_pylist()
    for r in rows:
        assert (r["generated_caption"] is not None) == (r["status"] == "ok")
        assert r["clip_score"] is not None and abs(np.linalg.norm(r["image_embedding"]) - 1) < 1e-4
    # rows come out in the manifest's order, whatever stage they finished in
    assert [r["key"] for r in rows] == [r["key"] for r in coco_captions()[:20]]
