"""deploy/: the example job specs are valid JobSpecs, and the Grafana dashboard asks only
for metrics (and labels) that pipeline/runtime/metrics.py exports, and shows all of them."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.runtime import metrics
from pipeline.spec import load_spec
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


@pytest.mark.parametrize("path", sorted((DEPLOY / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_job_specs_are_valid_and_use_object_storage(path):
    spec = load_spec(path)
    assert spec.source.uri.startswith("s3://") and spec.sink.uri.startswith("s3://")


def test_gpu_example_runs_model_actors_on_gpus():
    spec = load_spec(DEPLOY / "jobs" / "coco-s3-gpu.yaml")
    sections = [spec.text_embedding, spec.image_embedding, spec.captioning]
    assert all(s.enabled and s.num_gpus > 0 for s in sections)


def exported(name: str) -> str:
    base = name.removeprefix("ray_")
    for suffix in SUFFIXES:
        if base.endswith(suffix) and base.removesuffix(suffix) in metrics.METRIC_NAMES:
            return base.removesuffix(suffix)
    return base


def test_grafana_dashboard_queries_exported_metrics_and_labels():
    dash = json.loads((DEPLOY / "grafana" / "mmpipe-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    shown = set()
    for expr in exprs:
        names = {exported(n) for n in re.findall(r"\bray_mmpipe_\w+", expr)}
        assert names and names <= set(metrics.METRIC_NAMES), expr
        shown |= names
        tags = {"le"} | {t for n in names for t in metrics._DEFS[n][2]}
        used = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)\s*\"", expr))
        for group in re.findall(r"\bby \(([^)]*)\)", expr):
            used |= {g.strip() for g in group.split(",")}
        assert used <= tags, (expr, used - tags)
    assert shown == set(metrics.METRIC_NAMES), set(metrics.METRIC_NAMES) - shown
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "job"}
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
