"""Issue 12 items 1-3 as a whole job on a local Ray: a manifest written by a stranger names
a secret file outside the input (absolute, ``..``, ``file://``, a symlink), a FIFO,
``/dev/zero`` and a loopback URL. The job finishes; each such row is one error row; the
secret's bytes appear nowhere in the output (data, quarantine, anything under it, read
as raw bytes with compression off); quarantine keeps no bytes at all: the one file that
failed to decode is an HTML page, no media, so only its digest and size."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from pipeline.read import read_output
from pipeline.runtime.driver import run_job
from pipeline.spec import JobSpec
from tests.conftest import PHOTOS
from tests.e2e.jobs import check_accounting
from tests.http_server import FaultHTTPServer

SECRET = b"AWS_SECRET_ACCESS_KEY=do-not-leak-4f1c9e\nroot:x:0:0:root:/root:/bin/bash\n"
NOT_AN_IMAGE = b"<html>this page is not an image</html>\n" * 10


def test_untrusted_manifest_job(ray_local, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    src = tmp_path / "in"
    src.mkdir()
    photo = sorted(PHOTOS.glob("*.jpg"))[0]
    shutil.copy(photo, src / "good.jpg")
    (src / "page.jpg").write_bytes(NOT_AN_IMAGE)
    os.symlink(secret, src / "link.jpg")
    os.mkfifo(src / "pipe.jpg")
    with FaultHTTPServer() as server:
        rows = {"good": "good.jpg", "page": "page.jpg", "abs": str(secret),
                "dotdot": "../secret.txt", "fileuri": f"file://{secret}", "link": "link.jpg",
                "fifo": "pipe.jpg", "zero": "/dev/zero", "loop": server.url("ok", photo.name)}
        (src / "m.jsonl").write_text("".join(json.dumps({"key": k, "path": p}) + "\n"
                                             for k, p in rows.items()))
        out = tmp_path / "out"
        spec = JobSpec.model_validate({
            "name": "untrusted",
            "source": {"kind": "manifest", "uri": str(src / "m.jsonl"), "key_column": "key",
                       "partition_size": 5},
            "sink": {"uri": str(out), "compression": "none"},
            "download": {"timeout_s": 2.0, "retries": 0},
            "runtime": {"batch_size": 4, "num_workers": 1, "max_attempts": 1},
            "dedup": {"exact": False, "near": False},
            "text_embedding": {"enabled": False}})
        report = run_job(spec)
        assert server.counts == {}          # the loopback URL was refused, never requested
    assert report.complete
    check_accounting(str(out))
    data = read_output(str(out)).to_table()
    got = {r["key"]: (r["status"], r["error_reason"]) for r in data.to_pylist()}
    assert got == {"good": ("ok", None), "page": ("error", "not_an_image"),
                   **{k: ("error", "outside_input_root")
                      for k in ("abs", "dotdot", "fileuri", "link", "zero")},
                   "fifo": ("error", "not_a_file"), "loop": ("error", "egress_refused")}
    quarantine = read_output(str(out), kind="quarantine").to_table().to_pylist()
    kept = {r["key"]: r["source_bytes"] for r in quarantine}
    # an HTML page is no media (sink.quarantine_bytes: media): its digest, not its bytes
    assert set(kept.values()) == {None}
    (page,) = [r for r in quarantine if r["key"] == "page"]
    assert (page["source_sha256"], page["source_size"]) == (
        hashlib.sha256(NOT_AN_IMAGE).hexdigest(), len(NOT_AN_IMAGE))
    for path in out.rglob("*"):            # every file the job wrote, as raw bytes
        if path.is_file():
            raw = path.read_bytes()
            assert SECRET[:24] not in raw and b"root:x:0:0" not in raw, path
