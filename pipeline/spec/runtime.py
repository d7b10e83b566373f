"""The ``runtime`` section: how the job runs (workers, batches, retries, leases, resume
mode) and the prices its report costs the run with; none of it changes the output.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.spec.base import _Strict


class PricesSpec(_Strict):
    """Prices the job report turns CPU- and GPU-seconds into a cost with (any currency;
    both 0: no cost, only the seconds)."""

    cpu_hour: float = Field(0.0, ge=0, description="Price of one CPU core for one hour.")
    gpu_hour: float = Field(0.0, ge=0, description="Price of one GPU for one hour.")


class RuntimeSpec(_Strict):
    """How the job runs; none of this changes the output."""

    num_workers: int | None = Field(None, ge=1, description="A fixed number of PartitionWorker "
                                    "actors; default: an elastic pool (see `max_workers`).")
    max_workers: int | None = Field(
        None, ge=1, description="Elastic pool (`num_workers` unset): at most this many "
        "PartitionWorkers; default: one per partition remaining. The driver asks the "
        "autoscaler for that many worker bundles (`ray.autoscaler.sdk.request_resources`), "
        "starts more workers every few seconds while the cluster has free CPUs (nodes that "
        "joined mid-job) and partitions are queued, and lets idle workers go once the queue "
        "is empty.")
    worker_resources: dict[str, float] = Field(
        {}, description="Custom Ray resources each PartitionWorker requests besides its CPU, "
        "e.g. `{cpu_node: 1}` to keep CPU work off GPU nodes; the cluster's CPU worker group "
        "must advertise the resource (the chart: `worker.rayResources`; KubeRay: the group's "
        "`resources`), "
        "else the job fails after `resource_wait_s`. Default: none, workers go anywhere.")
    resource_wait_s: float = Field(
        600.0, gt=0, description="Seconds an actor may wait for a node that offers its "
        "resources (ModelActor GPUs/CPUs, PartitionWorker CPU and `worker_resources`) before "
        "the job fails naming what is missing; a surplus worker of a running job is "
        "dropped instead.")
    partitions_per_worker: int = Field(
        4, ge=0, description="When a new plan is made and the spec leaves "
        "`source.partition_size` (WebDataset: `shards_per_partition`) at its default, an "
        "input too small to give each worker this many partitions of that size is cut "
        "into smaller ones (by records, and by listed bytes for media files; at least "
        "`output.plan.MIN_PARTITION_RECORDS` records each), so that every worker has work "
        "(`output.plan.pack`); the workers counted are `num_workers`, else the cluster's "
        "CPUs (capped by `max_workers`). A size set in the spec is used as it is; 0 here: "
        "the default size as it is too. A stored plan is kept as it is (resume never "
        "re-cuts it); not part of the fingerprint.")
    batch_size: int = Field(32, ge=1, description="Records per batch inside a partition.")
    max_batch_bytes: int = Field(
        256 * 2**20, ge=1, description="Byte budget of the decoded pixels of one batch "
        "(bytes; images: width*height*3 from the header, videos: frame pixels*3 times the "
        "frames sampled): a batch read is cut into smaller batches so that one never "
        "holds more; a record larger than the budget is processed alone. A video's sampled "
        "frames never hold more: they are halved in width and height until they fit "
        "(`decode_flags`: `frames_downscaled`), or the row is a `too_large` error.")
    decode_threads: int = Field(2, ge=1, description="Threads per worker that read inputs; "
                                "the CPU steps (decode, resize, encode) of a worker run on "
                                "at most as many threads as the CPUs Ray gave it (one by "
                                "default), so workers never oversubscribe a node.")
    max_attempts: int = Field(3, ge=1, description="Attempts per partition before it is failed.")
    attempt_timeout_s: float = Field(
        3600.0, gt=0, description="Seconds one partition attempt may run: a longer one is "
        "cancelled (its worker is killed and replaced), then retried up to `max_attempts` "
        "and reported failed.")
    mode: Literal["resume", "append", "overwrite", "error-if-exists"] = Field(
        "resume", description="`resume`: continue the newest generation of the output, "
        "skipping partitions committed under the same fingerprint, with its stored plan (a "
        "grown input listing is reported: how many listed objects are not in the plan, "
        "exit code unchanged); `append`: resume, and first plan the listed objects that "
        "are not in the plan (new media files, shards, manifest files) as new partitions "
        "after the stored ones (`_plan/extension-0001.json` records each extension; old "
        "partitions and markers untouched), so only they run; a changed spec fingerprint "
        "still needs `overwrite`; `overwrite`: write a new "
        "generation (new plan and markers) beside the old ones, which are deleted only once "
        "it is complete; `error-if-exists`: refuse a non-empty output.")
    progress_interval_s: float = Field(10.0, gt=0, description="Seconds between log progress lines.")
    prices: PricesSpec = Field(
        PricesSpec(), description="`{cpu_hour, gpu_hour}`: with a price set the job report, `_SUCCESS` and "
        "`mmpipe status --json` give the run's cost and its cost per million output rows "
        "beside the CPU-core-seconds and GPU-seconds per stage (always given: partition "
        "workers' attempt wall time x their CPUs; each model stage's replica lifetime x "
        "its `num_cpus`/`num_gpus`, and its busy seconds).")
    lease_s: float = Field(
        60.0, gt=0, description="Seconds the job lease (one writer per output) and each "
        "attempt lease (what `mmpipe gc` spares) last without renewal; a crashed driver's "
        "output is free again after this long (at once on the same host).")
    lease_renew_s: float = Field(
        10.0, gt=0, description="Seconds between renewals of the job and attempt leases "
        "(less than `lease_s`).")

    @model_validator(mode="after")
    def _renew_within_lease(self) -> "RuntimeSpec":
        if self.lease_renew_s >= self.lease_s:
            raise ValueError("runtime.lease_renew_s must be less than runtime.lease_s")
        return self
