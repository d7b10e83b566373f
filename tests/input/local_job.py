"""Run a job spec through the real pipeline in this process (plan, ``run_partition`` per
partition, commit), without Ray: what a partition worker does, for input-edge tests."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.read import read_committed
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec

POOL = ThreadPoolExecutor(2)


def run_job(source: dict, out: Path, **sections) -> tuple[list[dict], planning.PartitionPlan]:
    """Plan and run every partition of a job reading ``source`` (the ``source`` section)
    into ``out``; return the committed rows (sorted by key) and the plan."""
    spec = JobSpec.model_validate({"source": source, "sink": {"uri": str(out)},
                                   "text_embedding": {"enabled": False}, **sections})
    pipeline = assemble(spec, executor=POOL, setup=True)
    source_ = pipeline.datasource
    plan = planning.write_plan(str(out), source_.list_inputs(), spec.source,
                               source_.items_per_partition, source_.plan_metadata,
                               rows_known=source_.rows_known)
    for pid in plan.partition_ids:
        outcome = run_partition(pipeline, planning.read_partition(str(out), pid), "a1", POOL)
        assert outcome.committed, outcome
    rows = read_committed(str(out)).to_pylist()
    return sorted(rows, key=lambda r: r["key"]), plan


def unread(plan: planning.PartitionPlan) -> dict[str, int]:
    """The plan's ``unread_by_extension`` accounting."""
    return json.loads(plan.datasource.get("unread_by_extension", "{}"))
