"""gc and the deletion of a generation delete only what mmpipe wrote (case T3-06), and a
job refuses a folder it did not make; without Ray, on the local filesystem and on a real
S3 API (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.assembly import assemble
from pipeline.errors import PlanError
from pipeline.output import gc, generations, layout
from pipeline.output import plan as planning
from pipeline.output.checkpoint import CheckpointStore, verify_files
from pipeline.runtime.partition import run_partition
from pipeline.runtime.preflight import check_output
from pipeline.spec import JobSpec
from pipeline.storage import fs
from tests.conftest import CASES

T3_06 = CASES / "T3-06_gc_foreign_files"
#: The user's files of the project template (relative path -> bytes).
USER_FILES = {p.relative_to(T3_06 / "project_template").as_posix(): p.read_bytes()
              for p in sorted((T3_06 / "project_template").rglob("*")) if p.is_file()}


@pytest.fixture(params=["local", "s3"])
def template(request, tmp_path):
    """The T3-06 project template (README.md, data/labels.csv, data/raw/notes.txt,
    wds/README.md) copied where the output goes, on the storage under test."""
    if request.param == "local":
        out = tmp_path / "project"
        shutil.copytree(T3_06 / "project_template", out)
        return str(out)
    root = f"s3://{request.getfixturevalue('s3_env')}/project"
    for rel, blob in USER_FILES.items():
        fs.write_bytes(f"{root}/{rel}", blob)
    return root


def _user_files(root: str) -> dict[str, bytes]:
    return {rel: fs.read_bytes(fs.join(fs.normalize(root), rel)) for rel in USER_FILES
            if fs.exists(fs.join(fs.normalize(root), rel))}


def _spec(root: str, mode: str = "resume", **sink) -> JobSpec:
    return JobSpec.model_validate({
        "source": {"kind": "files", "uri": str(T3_06 / "input"), "partition_size": 2},
        "sink": {"uri": root, "webdataset": {"enabled": True}, **sink},
        "text_embedding": {"enabled": False},
        "filters": {"min_width_px": 1, "min_height_px": 1}, "runtime": {"mode": mode}})


def _commit_all(spec: JobSpec, root: str, attempt: str) -> dict:
    """Plan ``spec`` at the generation root ``root`` and commit every partition; the
    commit markers by partition id."""
    pool = ThreadPoolExecutor(2)
    spec = spec.model_copy(update={"sink": spec.sink.model_copy(update={"uri": root})})
    pipeline = assemble(spec, executor=pool, setup=True)
    plan, _ = planning.load_or_create(root, spec.source, pipeline.datasource.list_inputs)
    for pid in plan.partition_ids:
        assert run_partition(pipeline, planning.read_partition(root, pid), attempt,
                             pool).committed
    return CheckpointStore(root).markers()


def test_attempt_files_are_named_by_the_layout_and_nothing_else():
    assert layout.attempt_of("data/p-000001/a-0123abcd4567/part-00000.parquet") == (
        "p-000001", "0123abcd4567")
    assert layout.attempt_of("_index/exact/b-0003/p-000002.a-x1.parquet") == ("p-000002", "x1")
    for rel in ("data/labels.csv", "data/raw/notes.txt", "wds/README.md", "README.md",
                "data/raw/a-x/notes.txt", "data/p-000001/notes.txt", "data/p-000001/a-x/",
                "data/inner/data/p-000000/a-y/part-00000.parquet", "_index/notes.txt"):
        assert layout.attempt_of(rel) is None, rel
        assert not layout.owned(rel), rel
    for rel in ("_SUCCESS", "_plan/plan.parquet", "_plan/partitions.parquet",
                "_checkpoints/p-000003.json", "_checkpoints/p-000003.json.tmp-0a1b",
                "_failures/p-000003.json", "_leases/p-000003.a1b2.json",
                "_dedup/generations/g-000001.json", "wds/p-000000/a-z9/p-000000-000000.tar"):
        assert layout.owned(rel), rel
    for rel in ("_plan/notes.txt", "_checkpoints/mine.csv", "_leases/notes.json"):
        assert not layout.owned(rel), rel


def test_a_folder_that_is_not_an_output_is_refused_before_anything_is_written(template):
    """T3-06: a run into the project template refuses it, naming what is there; with
    ``sink.allow_foreign_files`` it goes on."""
    before = sorted(e.uri for e in fs.list_files(template))
    for mode in ("resume", "overwrite"):
        spec = _spec(template, mode)
        with pytest.raises(PlanError) as e:
            check_output(spec, assemble(spec))
        msg = str(e.value)
        assert "is not an mmpipe output" in msg and "README.md, data, wds" in msg, msg
        assert "sink.allow_foreign_files" in msg
    assert sorted(e.uri for e in fs.list_files(template)) == before      # nothing written
    allowed = _spec(template, allow_foreign_files=True)
    assert check_output(allowed, assemble(allowed)) is False
    assert generations.foreign_entries(template) == ["README.md", "data", "wds"]


def test_gc_deletes_only_attempt_files_and_keeps_the_users(template, capsys):
    """The finding: `mmpipe gc` deleted data/labels.csv, data/raw/notes.txt and
    wds/README.md of a folder used as the output (exit 0)."""
    markers = _commit_all(_spec(template, allow_foreign_files=True), template, "a1")
    out = fs.normalize(template)
    stray = f"{out}/data/p-000000/a-crashed/part-00000.parquet"     # a lost attempt's
    fs.write_bytes(stray, b"partial")
    assert gc.unreferenced_files(template) == [stray]
    capsys.readouterr()
    assert cli.main(["gc", template]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 unreferenced files deleted"
    assert not fs.exists(stray)
    assert _user_files(template) == USER_FILES
    for m in markers.values():
        verify_files(template, m)


def test_overwrite_deletes_generation_one_but_not_the_users_files(template):
    """The finding: a completed `--mode overwrite` deleted generation 1's data/ and wds/
    trees whole, the user's files in them included."""
    spec = _spec(template, allow_foreign_files=True)
    first = _commit_all(spec, template, "g1")
    fs.write_bytes(fs.join(fs.normalize(template), "_SUCCESS"), b"{}")
    g2 = generations.generation_root(template, 2)
    assert generations.create(template, generations.GenerationRecord(generation=2,
                                                                     fingerprint="x"))
    _commit_all(spec, g2, "g2")
    fs.write_bytes(fs.join(g2, "_SUCCESS"), b"{}")
    gen1_files = [f for m in first.values() for f in m.files]
    assert gen1_files and any(f.startswith("wds/") for f in gen1_files)
    assert generations.delete_older(template, 2) == [1]
    out = fs.normalize(template)
    assert not any(fs.exists(fs.join(out, f)) for f in gen1_files)
    assert not fs.exists(fs.join(out, "_SUCCESS"))
    assert list(fs.list_files(fs.join(out, "_checkpoints"))) == []
    assert _user_files(template) == USER_FILES
    left = sorted(e.uri[len(out) + 1:] for e in fs.list_files(out)
                  if not e.uri.startswith(f"{out}/_generations/"))
    assert left == sorted(USER_FILES), left
    if fs.is_local(template):                        # emptied folders go, the user's stay
        assert not (Path(out) / "data" / "p-000000").exists()
        assert (Path(out) / "data" / "raw").is_dir()
    for m in CheckpointStore(g2).markers().values():
        verify_files(g2, m)


@pytest.mark.parametrize("where", ["data/inner", "data/p-000009/a-nest"])
def test_gc_never_enters_a_complete_output_nested_under_data(template, where):
    """The finding: gc of one output deleted a complete second output nested under its
    data/ (also when the nested output sits in a folder named like an attempt's)."""
    outer = _spec(template, allow_foreign_files=True)
    _commit_all(outer, template, "o1")
    inner_root = fs.join(fs.normalize(template), where)
    inner = _commit_all(_spec(inner_root), inner_root, "i1")
    fs.write_bytes(fs.join(inner_root, "_SUCCESS"), b"{}")
    inner_files = sorted(e.uri for e in fs.list_files(inner_root))
    found = gc.collect(template, margin_s=0.0)
    assert not [u for u in found.garbage if u.startswith(inner_root + "/")], found.garbage
    assert cli.main(["gc", template]) == 0
    assert sorted(e.uri for e in fs.list_files(inner_root)) == inner_files
    for m in inner.values():
        verify_files(inner_root, m)
    # nor does deleting the outer generation 1 (what a completed overwrite does)
    generations.delete_generation(template, generations.list_generations(template)[0])
    assert sorted(e.uri for e in fs.list_files(inner_root)) == inner_files
    assert _user_files(template) == USER_FILES


def test_gc_and_overwrite_never_follow_a_symlinked_folder(tmp_path):
    """The finding: gc followed a symbolic link to a folder under data/ and deleted the
    victim's files; here the links are named like mmpipe's own folders too."""
    victim = tmp_path / "victim"
    (victim / "a-old").mkdir(parents=True)
    (victim / "a-old" / "part-00000.parquet").write_bytes(b"the victim's")
    (victim / "p-000000" / "a-old").mkdir(parents=True)
    (victim / "p-000000" / "a-old" / "part-00000.parquet").write_bytes(b"the victim's too")
    (victim / "notes.txt").write_text("keep me")
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(b"a file linked into an attempt folder")
    out = tmp_path / "out"
    spec = _spec(str(out))
    _commit_all(spec, str(out), "a1")
    (out / "data" / "p-000007").symlink_to(victim)             # data/p-000007/a-old/...
    (out / "data" / "link").symlink_to(victim)
    (out / "wds" / "p-000001").mkdir(parents=True, exist_ok=True)
    (out / "wds" / "p-000001" / "a-zz").symlink_to(victim / "a-old")
    (out / "data" / "p-000000" / "a-x").mkdir()
    (out / "data" / "p-000000" / "a-x" / "part-00000.parquet").symlink_to(outside)
    if (out / "quarantine").exists():
        (out / "quarantine").rename(tmp_path / "q-real")
    (out / "quarantine").symlink_to(victim)                    # an attempt root itself
    before = sorted(p.relative_to(tmp_path).as_posix() for p in victim.rglob("*"))
    found = gc.collect(str(out), margin_s=0.0)
    assert found.garbage == [], found.garbage
    assert cli.main(["gc", str(out)]) == 0
    generations.delete_generation(str(out), generations.list_generations(str(out))[0])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in victim.rglob("*")) == before
    assert (victim / "p-000000" / "a-old" / "part-00000.parquet").read_bytes() == \
        b"the victim's too"
    assert outside.read_bytes() == b"a file linked into an attempt folder"
    assert not (out / "data" / "p-000000" / "a-a1").exists()      # its own files: gone
    assert (out / "data" / "p-000007").is_symlink() and (out / "quarantine").is_symlink()
