"""Trust at the edges, round 3 (slice 1: confinement and secrets), as attacks.

- A stranger's manifest in a home folder names ``.aws/credentials``, ``.ray/auth_token``
  and ``.ssh/id_rsa`` by relative names (no ``..``): hidden paths are refused under every
  root, so none of their bytes reach the output; a non-hidden, non-media file it names
  keeps only its digest and size in quarantine.
- A manifest at a bucket root is no root of the bucket: its rows read only what
  ``source.uri``/``source.allowed_roots`` declare (on a real S3 server).
- Output files and folders of a real job are owner-only (0600/0700) by default.
- A commit marker naming ``data/../../private/x.parquet`` is refused by ``read_output``,
  ``mmpipe ls`` and ``mmpipe export``, naming the marker and the name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from pipeline.dedup.store import DedupStore
from pipeline.dedup.tasks import data_files
from pipeline.errors import CommitError
from pipeline.read import read_output
from pipeline.runtime.dedup_pass import plan_generation
from pipeline.runtime.driver import run_job
from pipeline.spec import DatasetDedupSpec, JobSpec, SourceSpec
from tests.conftest import PHOTOS
from tests.security.test_input_confinement import read_all, reasons

PHOTO = min(PHOTOS.glob("*.jpg"))
AWS = b"[default]\naws_secret_access_key = round3-aws-7c1d0e2f\n"
RAY_TOKEN = b"round3-ray-token-5b2a9f33\n"
SSH_KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nround3-ssh-3e8f21aa\n"
NOTES = b"round3 private notes 91ab0c\n" * 4
SECRETS = {"aws": AWS, "ray": RAY_TOKEN, "ssh": SSH_KEY}


def _home(root: Path) -> Path:
    """A home folder with secrets in hidden folders, a note and a photo."""
    home = root / "home"
    for rel, data in ((".aws/credentials", AWS), (".ray/auth_token", RAY_TOKEN),
                      (".ssh/id_rsa", SSH_KEY), ("Documents/notes.txt", NOTES)):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(data)
    shutil.copy(PHOTO, home / "photo.jpg")
    return home


@pytest.fixture(scope="module")
def home_job(ray_local, tmp_path_factory):
    """A real job (local Ray) over a manifest in a tmp HOME naming its secrets."""
    tmp = tmp_path_factory.mktemp("home-job")
    home = _home(tmp)
    rows = {"aws": ".aws/credentials", "ray": ".ray/auth_token", "ssh": ".ssh/id_rsa",
            "ssh_dot": "./.ssh/id_rsa", "aws_back": "Documents/../.aws/credentials",
            "notes": "Documents/notes.txt", "photo": "photo.jpg"}
    (home / "m.jsonl").write_text("".join(json.dumps({"key": k, "path": p}) + "\n"
                                          for k, p in rows.items()))
    out = tmp / "out"
    spec = JobSpec.model_validate({
        "name": "home",
        "source": {"kind": "manifest", "uri": str(home / "m.jsonl"), "key_column": "key",
                   "partition_size": 1000},   # one partition: the tamper tests edit its marker
        "sink": {"uri": str(out), "compression": "none"},
        "runtime": {"batch_size": 4, "num_workers": 1, "max_attempts": 1},
        "dedup": {"exact": False, "near": False},
        "text_embedding": {"enabled": False}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        report = run_job(spec)
    assert report.complete
    return home, out


def test_home_manifest_copies_no_secret(home_job):
    _, out = home_job
    data = {r["key"]: r for r in read_output(str(out)).to_table().to_pylist()}
    assert {k: (r["status"], r["error_reason"]) for k, r in data.items()} == {
        **{k: ("error", "outside_input_root") for k in ("aws", "ray", "ssh", "ssh_dot",
                                                         "aws_back")},
        "notes": ("error", "not_an_image"), "photo": ("ok", None)}
    for key, hidden in (("aws", ".aws"), ("ray", ".ray"), ("ssh", ".ssh"),
                        ("ssh_dot", ".ssh"), ("aws_back", ".aws")):
        assert f"hidden file or folder '{hidden}'" in data[key]["error"], data[key]["error"]
        assert "source.allow_hidden" in data[key]["error"]
    quarantine = {r["key"]: r for r in read_output(str(out), kind="quarantine").to_table()
                  .to_pylist()}
    assert set(quarantine) == set(data) - {"photo"}
    # the note was read (not hidden) but is no media: its digest and size, not its bytes
    assert quarantine["notes"]["source_bytes"] is None
    assert quarantine["notes"]["source_sha256"] == hashlib.sha256(NOTES).hexdigest()
    assert quarantine["notes"]["source_size"] == len(NOTES)
    for key in SECRETS:   # refused before reading: nothing at all
        q = quarantine[key]
        assert (q["source_bytes"], q["source_sha256"], q["source_size"]) == (None, None, None)
    for path in out.rglob("*"):            # every file the job wrote, as raw bytes
        if path.is_file():
            raw = path.read_bytes()
            for secret in (*SECRETS.values(), NOTES):
                assert secret.strip().splitlines()[-1] not in raw, path


def _not_owner_only(root: Path) -> dict[str, int]:
    """Paths below ``root`` whose mode is not 0700 (folders) / 0600 (files)."""
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")}
    return {rel: oct(m) for rel, m in modes.items()
            if m != (0o700 if (root / rel).is_dir() else 0o600)}


def test_output_files_and_folders_are_owner_only(home_job, tmp_path, capsys):
    """Before: 0644 files in 0755 folders, readable by every local user."""
    _, out = home_job
    assert stat.S_IMODE(out.stat().st_mode) == 0o700      # the job created it
    paths = list(out.rglob("*"))
    assert any(p.suffix == ".parquet" for p in paths) and (out / "_SUCCESS").is_file()
    assert (out / "_checkpoints").is_dir() and (out / "_plan" / "plan.parquet").is_file()
    assert _not_owner_only(out) == {}
    # mmpipe export writes its copy owner-only too
    dest = tmp_path / "export"
    assert main(["export", str(out), str(dest)]) == 0, capsys.readouterr().err
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700 and list(dest.glob("*.parquet"))
    assert _not_owner_only(dest) == {}


def test_local_permissions_widen_the_modes(tmp_path):
    """``storage.local_permissions: all`` gives 0644/0755 (the umask is not applied)."""
    from pipeline.storage import fs

    old = os.umask(0o077)
    try:
        fs.set_local_permissions("all")
        fs.write_bytes(str(tmp_path / "o" / "a" / "f.json"), b"{}")
        assert fs.create_exclusive(str(tmp_path / "o" / "b" / "m.json"), b"{}")
        fs.set_local_permissions("group")
        out = fs.HashingOutput(str(tmp_path / "o" / "c" / "part.bin"))
        out.write(b"x")
        out.close()
    finally:
        fs.set_local_permissions()
        os.umask(old)
    def mode(rel: str) -> int:
        return stat.S_IMODE((tmp_path / "o" / rel).stat().st_mode)

    assert (mode("."), mode("a"), mode("a/f.json"), mode("b/m.json")) == (
        0o755, 0o755, 0o644, 0o644)
    assert (mode("c"), mode("c/part.bin")) == (0o750, 0o640)
    assert fs.local_modes() == (0o600, 0o700)
    with pytest.raises(ValueError, match="local_permissions"):
        fs.set_local_permissions("everyone")


def _tampered(out: Path, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A copy of ``out`` whose marker names ``name`` instead of its data file; a valid
    Parquet file (a copy of the data) waits at ``tmp_path/private/x.parquet``."""
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (marker_path,) = (copy / "_checkpoints").glob("p-*.json")
    marker = json.loads(marker_path.read_text())
    (data,) = [f for f in marker["files"] if f.startswith("data/")]
    (tmp_path / "private").mkdir()
    shutil.copy(copy / data, tmp_path / "private" / "x.parquet")
    marker["files"] = [name if f == data else f for f in marker["files"]]
    marker_path.write_text(json.dumps(marker))
    return copy, marker_path


@pytest.mark.parametrize("name", ["data/../../private/x.parquet",
                                  "data/p-000000/a-x/../../../../private/x.parquet",
                                  "/ABS/private/x.parquet",
                                  "data/p-999999/a-other/part-00000.parquet"])
def test_marker_naming_a_file_outside_its_attempt_is_refused(home_job, tmp_path, capsys,
                                                             name):
    _, out = home_job
    assert read_output(str(out)).count_rows() == 7          # the untampered output reads
    name = name.replace("/ABS", str(tmp_path))
    copy, marker_path = _tampered(out, tmp_path, name)
    assert pq.read_table(tmp_path / "private" / "x.parquet").num_rows == 7  # readable bait
    with pytest.raises(CommitError) as e:
        read_output(str(copy))
    assert str(marker_path) in str(e.value) and repr(name) in str(e.value)
    capsys.readouterr()
    assert main(["ls", str(copy)]) == 2
    err = capsys.readouterr()
    assert str(marker_path) in err.err and repr(name) in err.err and err.out == ""
    dest = tmp_path / "export"
    assert main(["export", str(copy), str(dest)]) == 2
    assert repr(name) in capsys.readouterr().err
    assert not dest.exists() or not any(dest.rglob("*"))
    # the dedup pass reads markers itself (its plan and its tasks' data files): refused too
    with pytest.raises(CommitError, match=re.escape(repr(name))):
        plan_generation(str(copy), DatasetDedupSpec())
    with pytest.raises(CommitError, match=re.escape(repr(name))):
        data_files(DedupStore(str(copy)), [marker_path.stem])


def test_bucket_root_manifest_reads_only_declared_roots(s3_server, s3_env):
    """``s3://bucket/manifest.jsonl`` does not make the bucket a root: before, every row
    below was read (the private object's bytes reached the batch)."""
    client, bucket = s3_server.client(), s3_env
    client.put_object(Bucket=bucket, Key="private/creds.txt", Body=AWS)
    client.put_object(Bucket=bucket, Key=".aws/credentials", Body=AWS)
    client.put_object(Bucket=bucket, Key="photos/a.jpg", Body=PHOTO.read_bytes())
    rows = [{"path": "private/creds.txt"}, {"path": "photos/a.jpg"},
            {"path": ".aws/credentials"}, {"path": f"s3://{bucket}/private/creds.txt"}]
    client.put_object(Bucket=bucket, Key="manifest.jsonl",
                      Body="".join(json.dumps(r) + "\n" for r in rows).encode())
    uri = f"s3://{bucket}/manifest.jsonl"
    cols = read_all(SourceSpec(kind="manifest", uri=uri))
    assert reasons(cols) == ["outside_input_root"] * 4
    assert "source.allowed_roots" in str(cols["_read_error"][0])
    assert all(b is None for b in cols["_source_bytes"])
    # a declared prefix opens exactly that prefix
    cols = read_all(SourceSpec(kind="manifest", uri=uri,
                               allowed_roots=(f"s3://{bucket}/photos",)))
    assert reasons(cols) == ["outside_input_root", None, "outside_input_root",
                             "outside_input_root"]
    assert cols["_source_bytes"][1] == PHOTO.read_bytes()
    # a declared bucket root: the user's choice, but hidden keys stay refused
    cols = read_all(SourceSpec(kind="manifest", uri=uri, allowed_roots=(f"s3://{bucket}",)))
    assert reasons(cols) == [None, None, "outside_input_root", None]
    assert "hidden file or folder '.aws'" in str(cols["_read_error"][2])


def test_hidden_paths_refused_unless_allowed(tmp_path):
    """Local: a hidden file, a hidden folder and a symlink into one are refused; a
    declared hidden root admits what is below it; ``allow_hidden`` admits all."""
    src = tmp_path / "in"
    (src / ".cache").mkdir(parents=True)
    (src / ".hidden.jpg").write_bytes(PHOTO.read_bytes())
    (src / ".cache" / "a.jpg").write_bytes(PHOTO.read_bytes())
    os.symlink(src / ".cache" / "a.jpg", src / "link.jpg")
    shutil.copy(PHOTO, src / "plain.jpg")
    rows = [".hidden.jpg", ".cache/a.jpg", "link.jpg", "plain.jpg"]
    (src / "m.jsonl").write_text("".join(json.dumps({"path": p}) + "\n" for p in rows))
    cols = read_all(SourceSpec(kind="manifest", uri=str(src / "m.jsonl")))
    assert reasons(cols) == ["outside_input_root"] * 3 + [None]
    assert "resolves to" in str(cols["_read_error"][2])
    cols = read_all(SourceSpec(kind="manifest", uri=str(src / "m.jsonl"),
                               allowed_roots=(str(src / ".cache"),)))
    assert reasons(cols) == ["outside_input_root", None, None, None]
    cols = read_all(SourceSpec(kind="manifest", uri=str(src / "m.jsonl"), allow_hidden=True))
    assert reasons(cols) == [None] * 4
    # a source.uri inside a hidden folder is fine: only components below a root count
    hidden_root = tmp_path / ".data"
    shutil.copytree(src, hidden_root, symlinks=False)
    cols = read_all(SourceSpec(kind="manifest", uri=str(hidden_root / "m.jsonl")))
    assert reasons(cols) == ["outside_input_root", "outside_input_root", None, None]
