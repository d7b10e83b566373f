"""The driver's hold on its output: the job lease, the generation it writes, completion.

``open_output(spec, pipeline, run_id)`` (called by ``driver.run_job`` before planning):

1. refuses an output that overlaps the input or is a bucket root
   (``generations.check_locations``), a non-empty folder that is not an mmpipe output
   unless ``sink.allow_foreign_files`` (``generations.check_foreign``, before anything is
   written), and a non-empty one under ``error-if-exists``;
2. takes the job lease (``job_lease.JobLease``: one writer per output; ``OutputBusy`` names
   the holder) and renews it every ``runtime.lease_renew_s`` seconds;
3. picks the generation: ``overwrite`` creates the next one (its record holds the
   fingerprint); ``resume`` continues the newest (a generation with no marker yet is
   adopted by a new fingerprint; one with markers of another fingerprint is refused later
   by ``preflight.committed_markers``); an output with no generation gets generation 1,
   at the root.

``OutputSession.spec`` is the job spec with ``sink.uri`` set to that generation's root:
the plan, the markers, the workers and the datasinks all work there, unchanged.
``complete(report)`` writes ``_SUCCESS`` (only while this run still holds the lease) and
deletes the older generations; ``close()`` releases the lease.

``OutputSession.tables`` keeps the output's Delta tables in step (``output.table.Publisher``:
reconciled at open, a partition published after its marker exists, the overwrite commit
of a complete new generation before the older ones are deleted), on a thread, while
this run holds the job lease; a failed table commit is logged, never fails the run.
"""

from __future__ import annotations

import logging

from pipeline.errors import CommitError
from pipeline.output import generations, plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.job_lease import JobLease
from pipeline.output.table import Publisher
from pipeline.spec import JobSpec

log = logging.getLogger(__name__)


class OutputSession:
    """A run's lease on its output and the generation it writes (``open_output``)."""

    def __init__(self, output: str, spec: JobSpec, generation: int, job_lease: JobLease):
        self.output, self.generation, self.lease = output, generation, job_lease
        self.root = generations.generation_root(output, generation)
        self.spec = spec.model_copy(update={"sink": spec.sink.model_copy(
            update={"uri": self.root})})
        self.tables = Publisher(output, self.root)

    def complete(self, report: dict) -> None:
        """Write ``_SUCCESS`` (``report``: the JobReport as a dict, plus the generation)
        and delete the generations older than this one. Raises ``CommitError`` if this run
        lost the job lease (another job took over: its data is not this run's to describe)."""
        if self.lease.lost.is_set() or not self.lease.held():
            raise CommitError(f"{self.output}: this run lost the job lease before it could "
                              "write _SUCCESS; run the job again")
        CheckpointStore(self.root).write_success(dict(report, generation=self.generation))
        self.tables.complete()   # the tables show this generation before the older go
        gone = generations.delete_older(self.output, self.generation)
        if gone:
            log.info("%s: generation %d complete; older generations %s deleted", self.output,
                     self.generation, gone)

    def close(self) -> None:
        """Publish what is queued for the tables, then release the job lease."""
        self.tables.close()
        self.lease.release()


def open_output(spec: JobSpec, pipeline, run_id: str) -> OutputSession:
    """Check the output, take its job lease and choose the generation (module docstring).
    Raises ``PlanError`` (``OutputBusy`` when another job holds the output)."""
    from pipeline.runtime.preflight import check_empty

    output = spec.sink.uri
    generations.check_locations(spec)
    generations.check_foreign(spec)   # before the job lease: nothing written into it
    if spec.runtime.mode == "error-if-exists":
        check_empty(output)
    rt = spec.runtime
    job_lease = JobLease.acquire(output, rt.lease_s, rt.lease_renew_s, run_id,
                                 pipeline.fingerprint, spec.name)
    try:
        number = _generation(output, spec, pipeline, run_id)
        job_lease.set_generation(number)
    except BaseException:
        job_lease.release()
        raise
    log.info("%s: run %s writes generation %d (%s)", output, run_id, number,
             generations.generation_root(output, number))
    session = OutputSession(output, spec, number, job_lease)
    session.tables.start()   # reconcile the tables with the markers first
    return session


def _generation(output: str, spec: JobSpec, pipeline, run_id: str) -> int:
    """The generation this run writes (created if new), under the job lease."""
    gens = generations.list_generations(output)
    mode = spec.runtime.mode
    sha = planning.source_sha256(spec.source)
    if gens and mode != "overwrite":
        newest = gens[-1]
        rec = newest.record
        if rec is not None and rec.fingerprint != pipeline.fingerprint \
                and not CheckpointStore(newest.root).committed_ids():
            generations.replace_record(output, generations.new_record(
                newest.number, pipeline, sha, run_id, mode))   # nothing committed: adopt it
        return newest.number
    number = gens[-1].number + 1 if gens else 1
    while not generations.create(output, generations.new_record(number, pipeline, sha,
                                                                run_id, mode)):
        number += 1       # only after a crash between creating a record and using it
    return number
