"""Whole-object writes are atomic on a local filesystem: a write that fails mid-way (a
full disk; here a writer that fails after half its bytes, and a real ``EFBIG`` from a file
size limit) leaves the old content, or no file, and no temporary file behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.storage import fs
from tests.conftest import REPO


def test_a_writer_failing_mid_way_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "_failures" / "p-000001.json"
    fs.write_bytes(str(path), b'{"error": "old"}')

    def half_then_full(f) -> None:
        f.write(b'{"error": "new, and lon')
        f.flush()
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        fs.write_local_atomic(str(path), half_then_full)
    assert path.read_bytes() == b'{"error": "old"}'
    assert os.listdir(path.parent) == ["p-000001.json"]

    fresh = tmp_path / "_failures" / "p-000002.json"
    with pytest.raises(OSError):
        fs.write_local_atomic(str(fresh), half_then_full)
    assert not fresh.exists() and os.listdir(path.parent) == ["p-000001.json"]


_FULL_DISK = r"""
import json, os, resource, signal, sys
from pipeline.output.checkpoint import CheckpointStore
from pipeline.storage import fs
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # then a write past the limit fails: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
out = sys.argv[1]
errors = []
for what, call in [
        ("record_failure", lambda: CheckpointStore(out).record_failure(
            "p-000001", {"partition_id": "p-000001", "error": "x" * 500})),
        ("write_bytes", lambda: fs.write_bytes(os.path.join(out, "_SUCCESS"), b"y" * 500)),
        ("create_exclusive", lambda: fs.create_exclusive(
            os.path.join(out, "_checkpoints", "p-000001.json"), b"z" * 500))]:
    try:
        call()
        errors.append((what, None))
    except OSError as e:   # StorageError (an OSError) names the file and the EFBIG text
        errors.append((what, e.errno or ("File too large" in str(e) and 27)))
print(json.dumps(errors))
"""


def test_a_real_write_failure_leaves_no_partial_json(tmp_path):
    """The reported bug: a full disk left an empty ``_failures/*.json``. A file size
    limit (``RLIMIT_FSIZE``: the kernel fails the write with ``EFBIG`` past 64 bytes)
    fails each driver write mid-way in a child process."""
    out = tmp_path / "out"
    (out / "_failures").mkdir(parents=True)
    (out / "_SUCCESS").write_bytes(b'{"old": 1}')
    got = subprocess.run([sys.executable, "-c", _FULL_DISK, str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert got.returncode == 0, got.stderr
    results = dict(json.loads(got.stdout))
    assert all(errno == 27 for errno in results.values()), results    # EFBIG
    assert os.listdir(out / "_failures") == []                         # no empty record
    assert (out / "_SUCCESS").read_bytes() == b'{"old": 1}'            # the old one kept
    assert not (out / "_checkpoints").exists() or os.listdir(out / "_checkpoints") == []
