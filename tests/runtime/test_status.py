"""``mmpipe status OUTPUT``: text and ``--json``, and its exit codes (0 complete, 1 a
partition failed, 2 not an mmpipe output, 3 partitions pending), on a real output written
by the partition runner in this process (no Ray)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from pipeline import cli
from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec


def test_status_exit_codes_text_and_json(mixed_input, tmp_path, capsys):
    (mixed_input / "notes.xyz").write_text("not media")        # counted as not read
    out = str(tmp_path / "out")
    spec = JobSpec.model_validate({
        "name": "mixed", "source": {"kind": "files", "uri": str(mixed_input),
                                    "partition_size": 10},
        "sink": {"uri": out}, "text_embedding": {"enabled": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    source = pipeline.datasource
    plan, _ = planning.load_or_create(out, spec.source, source.list_inputs,
                                      source.items_per_partition, source.plan_metadata)
    first, second = plan.partition_ids

    def status(*extra: str) -> tuple[int, str]:
        code = cli.main(["status", out, *extra])
        return code, capsys.readouterr().out

    assert run_partition(pipeline, planning.read_partition(out, first), "aaaa", pool).committed
    code, text = status()
    assert code == 3                                            # pending, nothing failed
    fp = pipeline.fingerprint
    assert text.splitlines()[0] == (f"job 'mixed': incomplete: 1 partitions pending "
                                    f"(fingerprint {fp})")
    assert "  partitions: 2 planned, 1 committed, 0 failed, 1 pending" in text
    assert "  input: 19 objects, 19 records planned, 10 rows out" in text
    assert "  not read (unlisted extension or container, unpaired sidecar, not a file): .xyz=1" in text

    CheckpointStore(out).record_failure(second, {"partition_id": second, "error": "boom"})
    code, text = status()
    assert code == 1
    assert "INCOMPLETE: 1 partitions failed" in text and f"  FAILED {second}: boom" in text
    code, raw = status("--json")
    state = json.loads(raw)
    assert code == 1 and state["partitions_failed"] == {second: "boom"}
    assert (state["job"], state["fingerprint"], state["complete"]) == ("mixed", fp, False)

    # a rerun commits it: complete (the failure record of a committed partition is ignored)
    assert run_partition(pipeline, planning.read_partition(out, second), "bbbb", pool).committed
    code, text = status()
    assert code == 0 and text.startswith(f"job 'mixed': complete (fingerprint {fp})")
    code, raw = status("--json")
    state = json.loads(raw)
    assert code == 0 and state["complete"] is True and state["rows_out"] == 19
    assert state["partitions_committed"] == 2 and state["partitions_pending"] == 0
    assert sum(state["rows_by_status"].values()) == 19
    assert state["inputs"]["unread_by_extension"] == {".xyz": 1}
    assert state["runs"] == {"": 2} and state["writer"] is None   # no run id recorded here
    pool.shutdown()


def test_status_of_a_path_that_is_not_an_output_exits_2(tmp_path, capsys):
    (tmp_path / "some.txt").write_text("x")
    for path in (tmp_path, tmp_path / "missing"):
        assert cli.main(["status", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"error: {path} is not an mmpipe output "
                                "(no _plan/ or _checkpoints/)\n")
