"""Readers of the JSON files a run writes survive a damaged one (empty, cut short,
not JSON): ``mmpipe status`` and ``mmpipe ls`` print a message and exit with a defined code,
never a traceback. Before the fix an empty ``_failures/*.json`` (what a full disk left)
made ``mmpipe status`` crash with ``JSONDecodeError``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.assembly import assemble
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore
from pipeline.output.layout import OutputLayout
from pipeline.runtime import status
from pipeline.runtime.partition import run_partition
from pipeline.spec import JobSpec
from tests import inproc


@pytest.fixture
def output(mixed_input, tmp_path) -> tuple[str, str, str]:
    """A real output of 2 partitions, the first committed: ``(uri, first, second)``."""
    out = str(tmp_path / "out")
    spec = JobSpec.model_validate({
        "name": "damaged", "source": {"kind": "files", "uri": str(mixed_input),
                                      "partition_size": 10},
        "sink": {"uri": out}, "text_embedding": {"enabled": False}})
    pool = ThreadPoolExecutor(2)
    pipeline = assemble(spec, executor=pool, setup=True)
    source = pipeline.datasource
    plan, _ = planning.load_or_create(out, spec.source, source.list_inputs,
                                      source.items_per_partition, source.plan_metadata)
    first, second = plan.partition_ids
    assert run_partition(pipeline, planning.read_partition(out, first), "aaaa", pool).committed
    pool.shutdown()
    return out, first, second


@pytest.fixture
def _mmpipe(capsys):
    """``mmpipe ARGS`` in this process (``tests/inproc.command``): a traceback in a shell
    is an exception through ``cli.main`` here, which fails the test."""
    return lambda *args: inproc.command(capsys, *args)


@pytest.mark.parametrize("content", [b"", b'{"partition_id": "p-0', b"\xff\xfe", b"[1, 2]"],
                         ids=["empty", "cut-short", "not-utf8", "not-an-object"])
def test_a_damaged_failure_record_still_reads_as_a_failure(_mmpipe, output, content):
    out, _, second = output
    path = OutputLayout(out).failure(second)
    CheckpointStore(out).record_failure(second, {"partition_id": second, "error": "boom"})
    with open(path, "wb") as f:                       # what a full disk left, and worse
        f.write(content)
    got = _mmpipe("status", out)
    assert got.returncode == status.EXIT_FAILED == 1, got.stderr
    assert "Traceback" not in got.stderr
    assert f"  FAILED {second}: unreadable failure record {path}" in got.stdout
    state = json.loads(_mmpipe("status", out, "--json").stdout)
    assert list(state["partitions_failed"]) == [second] and state["partitions_committed"] == 1


def test_a_damaged_success_file_is_a_warning(_mmpipe, output):
    out, _, _ = output
    success = OutputLayout(out).success
    with open(success, "wb") as f:
        f.write(b'{"job": "dam')
    got = _mmpipe("status", out)
    assert got.returncode == status.EXIT_INCOMPLETE == 3, got.stderr
    assert f"  warning: unreadable {success}: " in got.stdout and "Traceback" not in got.stderr


def test_a_damaged_commit_marker_gives_a_message_and_a_defined_code(_mmpipe, output):
    out, first, _ = output
    marker = OutputLayout(out).marker(first)
    with open(marker, "wb") as f:
        f.write(b"")
    got = _mmpipe("status", out)
    assert got.returncode == status.EXIT_UNREADABLE == 4, (got.stdout, got.stderr)
    assert got.stderr.startswith(f"error: {out}: cannot read its status: CommitError: "
                                 f"unreadable commit marker {marker}")
    assert "Traceback" not in got.stderr
    got = _mmpipe("ls", out)
    assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
    assert got.stderr.startswith("error: ") and "unreadable commit marker" in got.stderr
