"""``runtime.cost``: CPU-/GPU-seconds per stage and the cost per million rows."""

from __future__ import annotations

import pytest

from pipeline.runtime.cost import format_cost, run_cost
from pipeline.spec import JobSpec


def _spec(**runtime) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": "in"}, "sink": {"uri": "out"},
        "image_embedding": {"enabled": True, "model": "m", "num_cpus": 2, "num_gpus": 0.5},
        "runtime": runtime})


ACTORS = [{"model": "image_embedding", "alive_s": 100.0, "busy_s": 60.0},
          {"model": "image_embedding", "alive_s": 80.0, "busy_s": 20.0}]


def test_stages_and_cost_per_million_rows():
    cost = run_cost(_spec(prices={"cpu_hour": 0.036, "gpu_hour": 3.6}), 360.0, ACTORS, 2000)
    assert cost["stages"] == {
        "partition_workers": {"cpu_s": 360.0, "gpu_s": 0.0, "busy_s": 360.0},
        "image_embedding": {"replicas": 2, "cpu_s": 360.0, "gpu_s": 90.0, "busy_s": 80.0}}
    assert (cost["cpu_s"], cost["gpu_s"]) == (720.0, 90.0)
    # 720 s x 0.036/3600 + 90 s x 3.6/3600 = 0.0072 + 0.09
    assert cost["cost"] == pytest.approx(0.0972)
    assert cost["per_million_rows"] == pytest.approx(48.6)
    line = format_cost(cost)
    assert "720.0 CPU-core-s, 90.0 GPU-s" in line and "48.6 per million output rows" in line


def test_no_prices_no_rows_and_models_inside_workers():
    cost = run_cost(_spec(), 10.0, ACTORS, 0, models_in_workers=True)
    assert cost == {"stages": {"partition_workers": {"cpu_s": 10.0, "gpu_s": 0.0,
                                                     "busy_s": 10.0}},
                    "cpu_s": 10.0, "gpu_s": 0.0}
    assert "per million" not in format_cost(cost)
    priced = run_cost(_spec(prices={"cpu_hour": 1}), 10.0, [], 0)
    assert priced["per_million_rows"] is None and priced["cost"] == pytest.approx(10 / 3600, abs=1e-6)
