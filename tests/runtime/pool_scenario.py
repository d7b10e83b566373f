"""Run by test_pool_scaler.py in its own process: a job with a slow model stage
(text_embedding, whose backend sleeps ``SLOW_S`` per batch while the flag file ``slow``
exists) and a fast one (image_embedding, a tiny CLIP), both ``replicas: {min: 1, max: 2}``,
on a local Ray of 6 CPUs, one record per batch. The slow stage should get a second
replica; once the scenario removes ``slow`` (after that replica joined) its queue empties
and it should go back to one. The last partitions (``HELD``) wait before their first
batch while the flag file ``hold`` exists, so the job outlasts both changes; ``hold`` goes
once the second replica is gone (or after ``HOLD_MAX_S``). Both hooks are installed in
every Ray worker process by ``worker_process_setup_hook``.

Usage: python pool_scenario.py WORK_DIR RESULT_JSON
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

SLOW_S = 1.0
HELD = {"p-000016", "p-000017", "p-000018"}
HOLD_MAX_S = 120.0
FLAGS_ENV = "MMPIPE_TEST_POOL_FLAGS"
SECOND = "ModelActor-text_embedding-1"


def install() -> None:
    """Patch this process: the text backend sleeps while ``slow`` exists, the batches of
    the ``HELD`` partitions wait while ``hold`` exists."""
    from pipeline.models import text
    from pipeline.runtime import partition

    flags = Path(os.environ[FLAGS_ENV])
    run, steps = text.SentenceTransformerBackend.run, partition._run_steps  # noqa: SLF001

    def slow_run(self, prepared):
        if (flags / "slow").exists():
            time.sleep(SLOW_S)
        return run(self, prepared)

    def held_steps(pipeline, batch, *args, **kwargs):
        t0 = time.monotonic()
        while (batch["partition_id"][0] in HELD and (flags / "hold").exists()
               and time.monotonic() - t0 < HOLD_MAX_S):
            time.sleep(0.2)
        return steps(pipeline, batch, *args, **kwargs)

    text.SentenceTransformerBackend.run = slow_run
    partition._run_steps = held_steps  # noqa: SLF001


class _Joined(logging.Handler):
    """Sets ``event`` when the driver logs that the slow stage has two replicas."""

    def __init__(self):
        super().__init__()
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "model stage text_embedding: 2 replicas":
            self.event.set()


def _named(ray) -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}


def _until(predicate, job: threading.Thread, limit_s: float) -> float | None:
    """Seconds until ``predicate()`` held (polled every 0.2 s), None if the job ended or
    ``limit_s`` passed first."""
    t0 = time.monotonic()
    while job.is_alive() and time.monotonic() - t0 < limit_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def main(work: str, result_path: str) -> None:
    import ray

    from pipeline.runtime.driver import run_job
    from pipeline.spec import load_spec
    from pipeline.testing.tiny_models import build_clip

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    flags = Path(work) / "flags"
    flags.mkdir(parents=True)
    (flags / "slow").touch()
    (flags / "hold").touch()
    clip = build_clip(Path(work) / "tiny-clip")
    ray.init(address="local", num_cpus=6, include_dashboard=False, logging_level="WARNING",
             runtime_env={"worker_process_setup_hook": "tests.runtime.pool_scenario.install",
                          "env_vars": {"HF_HUB_OFFLINE": "1", FLAGS_ENV: str(flags)}})
    pool = "{min: 1, max: 2, idle_s: 3}"
    result: dict = {}
    try:
        spec = load_spec("examples/quickstart.yaml", [
            "name=pools", "source.partition_size=3", "runtime.batch_size=1",
            "runtime.max_workers=3", "text_embedding.batch_size=1",
            "text_embedding.num_cpus=0.5", f"text_embedding.replicas={pool}",
            "image_embedding.enabled=true", f"image_embedding.model={clip}",
            "image_embedding.num_cpus=0.5", "image_embedding.batch_size=1",
            f"image_embedding.replicas={pool}"], output_uri=str(Path(work) / "out"))
        joined = _Joined()
        logging.getLogger("pipeline.runtime.pool_scaler").addHandler(joined)
        reports: dict = {}
        job = threading.Thread(target=lambda: reports.update(r=run_job(spec)))
        job.start()
        result["second_after_s"] = _until(lambda: SECOND in _named(ray), job, 120)
        result["joined"] = joined.event.wait(180)
        time.sleep(5)   # both replicas serve for a while; then the slow stage turns fast
        (flags / "slow").unlink()
        result["second_gone_after_s"] = _until(lambda: SECOND not in _named(ray), job,
                                               HOLD_MAX_S)
        (flags / "hold").unlink()
        job.join(300)
        report = reports["r"]
        result["report"] = report.to_dict()
        result["formatted"] = report.format()
    finally:
        ray.shutdown()
    with open(result_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
