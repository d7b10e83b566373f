"""Trust at the edges, round 3, finding 5: ``mmpipe submit`` uploaded ``credentials.json``
and ``*.pem`` from the working directory. Credential-looking files are now left out by
default (``submit.CREDENTIAL_EXCLUDES``, extended with ``--exclude``), and submit prints
what it uploads and what it left out. The upload is checked with Ray's own traversal
and matcher on a real directory tree (what ``working_dir`` packaging does)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.runtime import submit
from tests.deploy.test_submit import FakeJobs

FILES = {
    "pipeline/__init__.py": "", "job.yaml": "name: x\n", "data/a.jpg": "jpeg",
    "models/tiny/tokenizer.json": "{}", "models/tiny/special_tokens_map.json": "{}",
    "models/tiny/tokenizer_config.json": "{}", "docs/keys.md": "about keys",
    # credential-looking: never uploaded
    "credentials.json": '{"private_key": "round3"}', "x.pem": "-----BEGIN PRIVATE KEY-----",
    "deploy/tls/server.key": "key", ".aws/credentials": "[default]",
    ".ssh/id_rsa": "ssh", ".ssh/config": "Host *", ".ray/auth_token": "tok",
    "conf/.netrc": "machine x", "id_ed25519.pub": "pub", "api_token": "tok",
    "helm/s3-secret-values.yaml": "s", "store.p12": "p12",
    # --exclude build/
    "build/big.bin": "b",
}
KEPT = ["data/a.jpg", "docs/keys.md", "job.yaml", "models/tiny/special_tokens_map.json",
        "models/tiny/tokenizer.json", "models/tiny/tokenizer_config.json",
        "pipeline/__init__.py"]
EXCLUDED = [".aws/credentials", ".ray/auth_token", ".ssh/config", ".ssh/id_rsa", "api_token",
            "build/big.bin", "conf/.netrc", "credentials.json", "deploy/tls/server.key",
            "helm/s3-secret-values.yaml", "id_ed25519.pub", "store.p12", "x.pem"]


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _ray_uploads(root: Path, excludes: list[str]) -> list[str]:
    """The files Ray's working_dir packaging takes from ``root`` with ``excludes``."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    files: list[Path] = []
    _dir_travel(root, [_get_excludes(root, excludes)],
                lambda p: files.append(p) if p.is_file() else None, include_gitignore=True)
    return sorted(p.relative_to(root).as_posix() for p in files)


@pytest.fixture
def jobs(monkeypatch):
    fake = FakeJobs()
    monkeypatch.setattr(submit, "client", lambda address: fake)
    return fake


def test_submit_leaves_credentials_out_and_says_so(tmp_path, jobs):
    root = _checkout(tmp_path)
    printed = io.StringIO()
    sub = submit.submit(str(root / "job.yaml"), [], working_dir=str(root),
                        exclude=["build/"], submission_id="s-1", out=printed)
    (call,) = jobs.calls
    env = call["runtime_env"]
    assert env["working_dir"] == str(root)
    assert _ray_uploads(root, env["excludes"]) == KEPT      # what Ray really packs
    assert list(sub.upload.files) == KEPT
    assert sub.upload.size_bytes == sum(len(FILES[f]) for f in KEPT)
    assert list(sub.upload.excluded) == EXCLUDED
    text = printed.getvalue()
    assert f"upload:    {len(KEPT)} files" in text and str(root) in text
    assert all(name in text for name in EXCLUDED)
    # before: only .env/.git/... were excluded, so these travelled
    assert {"credentials.json", "x.pem"} <= set(_ray_uploads(root, submit.WORKING_DIR_EXCLUDES))


def test_a_spec_that_looks_like_a_credential_is_refused_before_upload(tmp_path, jobs):
    root = _checkout(tmp_path)
    (root / "secret-job.yaml").write_text("name: x\n")
    with pytest.raises(submit.SubmitError, match="excluded from the upload"):
        submit.submit(str(root / "secret-job.yaml"), [], working_dir=str(root))
    assert jobs.calls == []


def test_mmpipe_submit_prints_the_upload_and_the_excluded(tmp_path, jobs, capsys):
    root = _checkout(tmp_path)
    (root / "job.yaml").write_text(
        "name: creds\nsource: {kind: files, uri: 's3://bucket/in'}\n"
        "sink: {uri: 's3://bucket/out'}\ntext_embedding: {enabled: false}\n")
    code = main(["submit", str(root / "job.yaml"), "--working-dir", str(root),
                 "--address", "http://head:8265", "--exclude", "build/"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"upload:    {len(KEPT)} files" in out and "submitted mmpipe-creds-" in out
    assert "credentials.json" in out and "x.pem" in out and "build/big.bin" in out
    (call,) = jobs.calls
    assert "build/" in call["runtime_env"]["excludes"]
    assert "credentials.json" not in _ray_uploads(root, call["runtime_env"]["excludes"])
