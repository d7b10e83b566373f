"""deploy/: the example job specs are valid JobSpecs; the chart's Grafana dashboard and alert
rules (helm/mmpipe/files/) ask only for metrics (and labels) that pipeline/runtime/metrics.py
exports, the dashboard shows all of them, and counters are read through rate()/increase()."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from pipeline.runtime import metrics
from pipeline.spec import load_spec
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
CHART_FILES = REPO / "helm" / "mmpipe" / "files"
DASHBOARD = CHART_FILES / "mmpipe-dashboard.json"
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


# labels Prometheus adds to every scraped series (the chart's PodMonitor)
TARGET_LABELS = {"ray_io_cluster", "ray_io_node_type", "instance"}


def check_expr(expr: str, ray_metrics: bool = False) -> set[str]:
    """The mmpipe metrics ``expr`` uses; asserts they are exported and that it filters and
    groups only by their tags, ``le`` and the scrape's target labels."""
    names = {exported(n) for n in re.findall(r"\bray_mmpipe_\w+", expr)}
    assert names <= set(metrics.METRIC_NAMES), expr
    assert names or (ray_metrics and re.search(r"\bray_\w+", expr)), expr
    tags = {"le"} | TARGET_LABELS | {t for n in names for t in metrics._DEFS[n][2]}
    if ray_metrics and not names:
        return names                              # Ray's own metrics: its labels
    used = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
        used |= {g.strip() for g in group.split(",")}
    assert used <= tags, (expr, used - tags)
    return names


def test_grafana_dashboard_queries_exported_metrics_and_labels():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    shown = set()
    for expr in exprs:
        shown |= check_expr(expr)
    assert shown == set(metrics.METRIC_NAMES), set(metrics.METRIC_NAMES) - shown
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "cluster", "job"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_every_dashboard_query_filters_by_cluster_and_job():
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            for selector in re.findall(r"\bray_mmpipe_\w+(\{[^}]*\})?", target["expr"]):
                assert 'ray_io_cluster=~"$cluster"' in selector, (panel["title"], target)
                assert 'job_name=~"$job"' in selector, (panel["title"], target)


def test_alert_rules_cover_failures_stalls_and_idle_gpus():
    rules = {r["alert"]: r for g in yaml.safe_load((CHART_FILES / "mmpipe-rules.yaml")
                                                  .read_text())["groups"] for r in g["rules"]}
    assert {"MmpipePartitionsFailed", "MmpipeProgressStalled", "MmpipeModelActorsIdle",
            "MmpipeGpusIdle"} <= set(rules)
    for name, r in rules.items():
        check_expr(r["expr"], ray_metrics=True)
        assert r["labels"]["severity"] in ("info", "warning", "critical"), name
        assert r["annotations"]["summary"], name
    assert "partitions_failed_total" in rules["MmpipePartitionsFailed"]["expr"]
    assert "partitions_committed_total" in rules["MmpipeProgressStalled"]["expr"]


COUNTER_READ = re.compile(
    r"\b(?:rate|increase)\((ray_mmpipe_\w+)(\{[^}]*\})?\[[^\]]+\]\)"        # rate(x[5m])
    r"|\((ray_mmpipe_\w+)(\{[^}]*\})? unless \3(\{[^}]*\})? offset [$\w]+\)")  # new series


def test_dashboard_reads_counters_through_rate_and_sums_by_job():
    """Counters are per process (a worker's restart resets its series; a new series starts at
    its first increment): the dashboard reads them through rate()/increase() (and counts a
    series new in the range by its value), never as raw sums; every aggregation says what it
    keeps, and the stat panels keep cluster and job."""
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            rest = COUNTER_READ.sub("", expr)
            raw = [n for n in re.findall(r"\bray_mmpipe_\w+", rest)
                   if n.endswith(("_total", "_bucket", "_sum", "_count"))]
            assert raw == [], (panel["title"], expr)
            assert not re.search(r"\b(sum|avg|max|min|count)\s*\(", expr), (panel["title"], expr)
            if panel["type"] == "stat":
                assert re.match(r"sum by \(ray_io_cluster, job_name\) \(", expr), panel["title"]
                assert "{{job_name}}" in target["legendFormat"], panel["title"]
