"""Delta tables at odd locations: every character a file name or an S3 key may hold is
handed to deltalake encoded once, the way it takes a location (a local path as it is; an
S3 key percent-encoded in an ``s3://`` URL). A ``%`` followed by two hex digits is the one
thing delta-rs cannot hold (it decodes such a sequence twice): a job spec whose output has
one fails before anything runs, naming ``sink.uri``; ``mmpipe table`` on such a folder is
one error line, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.errors import SpecError
from pipeline.output.table import open_table
from pipeline.read import read_output
from pipeline.spec.load import load_spec
from tests.conftest import PHOTOS, REPO, upload_dir
from tests.input.local_job import run_job

ODD = ["a b", "h#x", "p+q", "\u00e9t\u00e9", "s;=t", "pct%", "100%done", "q?x", "st*r",
       "qu\"o'te", "<a|b>", "c{u}r^l~y`", "[br]&$!@,"]


@pytest.fixture
def output(tmp_path) -> Path:
    """A committed output of 3 photos (no Delta table yet), to copy under odd names."""
    src = tmp_path / "in"
    src.mkdir()
    for p in sorted(PHOTOS.glob("*.jpg"))[:3]:
        shutil.copy(p, src)
    run_job({"kind": "files", "uri": str(src)}, tmp_path / "out")
    return tmp_path / "out"


def _table_rows(uri: str) -> list[str]:
    found = open_table(uri)
    assert found is not None, uri
    return sorted(found.to_pyarrow_table(columns=["key"])["key"].to_pylist())


def test_local_tables_under_odd_names(output, tmp_path, capsys):
    want = sorted(read_output(str(output), ["key"]).to_table()["key"].to_pylist())
    assert len(want) == 3
    for name in ODD:
        dst = tmp_path / name / "out"
        shutil.copytree(output, dst)
        assert cli.main(["table", str(dst)]) == 0, name
        assert _table_rows(str(dst)) == want, name
        assert (dst / "_delta_log" / "00000000000000000000.json").is_file(), name
        assert cli.main(["table", str(dst), "--rebuild"]) == 0, name
        assert _table_rows(str(dst)) == want, name
    capsys.readouterr()

    # %20 in the path: one line naming the location and why, exit 2, nothing written
    dst = tmp_path / "pct%20dir" / "out"
    shutil.copytree(output, dst)
    for args in (["table", str(dst)], ["table", str(dst), "--rebuild"]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"error: Delta table at {dst}: ") and "'%20'" in err, err
    assert not (dst / "_delta_log").exists() and not (tmp_path / "pct dir").exists()
    assert read_output(str(dst), ["key"]).count_rows() == 3     # the Parquet output is whole
    # a control character, a backslash (delta-rs reads it as "/")
    for name, shown in (("a\tb", "'\\t'"), ("b\\s", "'\\\\'")):
        dst = tmp_path / name / "out"
        shutil.copytree(output, dst)
        assert cli.main(["table", str(dst)]) == 2
        assert f"holds {shown}: deltalake (delta-rs) cannot keep" in capsys.readouterr().err


def test_a_spec_whose_output_holds_percent_hex_fails_naming_sink_uri(tmp_path):
    with pytest.raises(SpecError, match=r"sink\.uri: .*'%2[fF]': deltalake \(delta-rs\) "
                       r"cannot keep"):
        load_spec(REPO / "examples/quickstart.yaml", [], None, str(tmp_path / "a%2Fb" / "out"))
    with pytest.raises(SpecError, match=r"sink\.uri: .*'%41'"):
        load_spec(REPO / "examples/quickstart.yaml", [], None, "s3://bucket/x%41/out")
    for fine in ("pct%", "100%done", "a b#c"):
        spec = load_spec(REPO / "examples/quickstart.yaml", [], None, str(tmp_path / fine))
        assert spec.sink.uri.endswith(fine)


def test_s3_tables_under_odd_keys(output, s3_server, s3_env):
    want = sorted(read_output(str(output), ["key"]).to_table()["key"].to_pylist())
    client = s3_server.client()
    for name in ODD:
        upload_dir(client, s3_env, f"{name}/out", output)
        uri = f"s3://{s3_env}/{name}/out"
        assert cli.main(["table", uri]) == 0, name
        assert _table_rows(uri) == want, name
        logs = client.list_objects_v2(Bucket=s3_env, Prefix=f"{name}/out/_delta_log/")
        assert [o["Key"] for o in logs.get("Contents", [])] == \
            [f"{name}/out/_delta_log/00000000000000000000.json"], name
