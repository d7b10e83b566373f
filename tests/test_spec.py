"""Job spec validation, overrides, fingerprint and the ``mmpipe validate`` exit code."""

from __future__ import annotations

import pytest

from pipeline.errors import SpecError
from pipeline.assembly import fingerprint
from pipeline.spec import JobSpec, load_spec
from tests.conftest import REPO
from tests import inproc

QUICKSTART = REPO / "examples" / "quickstart.yaml"


def test_quickstart_spec_is_valid_and_has_at_least_4_partitions():
    spec = load_spec(QUICKSTART)
    assert spec.source.kind == "manifest"
    assert spec.source.partition_size * 4 <= 57 + spec.source.partition_size - 1
    assert -(-57 // spec.source.partition_size) >= 4


def test_bad_value_names_field_and_value():
    with pytest.raises(SpecError) as e:
        load_spec(QUICKSTART, ["resize.size_px=-3"])
    assert e.value.field == "resize.size_px"
    assert e.value.value == -3
    assert "resize.size_px" in str(e.value) and "-3" in str(e.value)


def test_unknown_field_is_rejected():
    with pytest.raises(SpecError) as e:
        load_spec(QUICKSTART, ["resize.sise_px=128"])
    assert e.value.field == "resize.sise_px"


def test_overrides_input_output_and_set():
    spec = load_spec(QUICKSTART, ["source.partition_size=4", "filters.max_aspect_ratio=2.5"],
                     input_uri="/data/in.parquet", output_uri="/data/out")
    assert spec.source.uri == "/data/in.parquet"
    assert spec.sink.uri == "/data/out"
    assert spec.source.partition_size == 4
    assert spec.filters.max_aspect_ratio == 2.5


def test_fingerprint_tracks_output_fields_only():
    base = fingerprint(load_spec(QUICKSTART))
    assert fingerprint(load_spec(QUICKSTART, ["runtime.num_workers=7"])) == base
    assert fingerprint(load_spec(QUICKSTART, [], output_uri="/elsewhere")) == base
    assert fingerprint(load_spec(QUICKSTART, ["resize.size_px=128"])) != base
    assert fingerprint(load_spec(QUICKSTART, ["source.partition_size=5"])) != base


def test_cli_validate_exit_codes(tmp_path, capsys):
    ok = inproc.command(capsys, "validate", str(QUICKSTART))
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {kind: files, uri: /x, partition_size: 0}\nsink: {uri: /y}\n")
    out = inproc.command(capsys, "validate", str(bad))
    assert out.returncode == 2
    assert "source.partition_size" in out.stderr and "got 0" in out.stderr
    out = inproc.command(capsys, "validate", str(QUICKSTART), "--set", "source.kind=ftp")
    assert out.returncode == 2 and "source.kind" in out.stderr and "'ftp'" in out.stderr
    out = inproc.command(capsys, "validate", str(QUICKSTART), "--input",
                         str(REPO / "data/photos"), "--set", "source.kind=files")
    assert out.returncode == 2 and out.stdout == ""
    assert ("source.path_column: 'file' does not apply to source.kind 'files' (used by: "
            "manifest)") in out.stderr


def test_extensions_are_normalised_to_dotted_lower_case():
    from pipeline.spec import SourceSpec

    spec = SourceSpec(kind="files", uri="x", extensions=["mp4", ".MOV", " .webm "])
    assert spec.media_extensions == (".mp4", ".mov", ".webm")
    assert SourceSpec(kind="files", uri="x", media="video").media_extensions[0] == ".mp4"
    with pytest.raises(ValueError, match="extensions"):
        SourceSpec(kind="files", uri="x", extensions=["."])


WEBDATASET = REPO / "examples" / "webdataset.yaml"
IMAGES = REPO / "examples" / "images.yaml"


def test_quickstart_reused_for_a_folder_names_the_manifest_only_fields():
    """Issue 16's trial: the manifest quickstart with `--set source.kind=files` used to pass
    validation and fail at run time; now each manifest-only field it sets is named."""
    with pytest.raises(SpecError) as e:
        load_spec(QUICKSTART, ["source.kind=files"], input_uri="data/photos")
    assert e.value.field == "source.path_column" and e.value.value == "file"
    assert str(e.value).splitlines()[1:] == [
        "  source.path_column: 'file' does not apply to source.kind 'files' (used by: manifest)"
        " [from --set source.kind=files]",
        "  source.key_column: 'key' does not apply to source.kind 'files' (used by: manifest)"
        " [from --set source.kind=files]"]


@pytest.mark.parametrize("spec, override, message", [
    (WEBDATASET, "source.partition_size=10",
     "source.partition_size: 10 does not apply to source.kind 'webdataset' (used by: files, manifest, plugin)"),
    (IMAGES, "source.shards_per_partition=2",
     "source.shards_per_partition: 2 does not apply to source.kind 'files' (used by: webdataset)"),
    (IMAGES, "source.manifest_format=csv",
     "source.manifest_format: 'csv' does not apply to source.kind 'files' (used by: manifest)"),
    (QUICKSTART, "source.extensions=[jpg]",
     "source.extensions: ['.jpg'] does not apply to source.kind 'manifest' (used by: files, webdataset, plugin)"),
])
def test_a_field_the_kind_does_not_use_is_an_error(spec, override, message):
    with pytest.raises(SpecError) as e:
        load_spec(spec, [override])
    assert str(e.value).splitlines()[1:] == ["  " + message + f" [from --set {override}]"]
    assert e.value.field == override.split("=")[0]


def test_fields_left_at_their_defaults_never_error():
    """Defaults (and a dumped spec, as the driver sends it to workers) validate for every
    kind; caption_column applies to every kind."""
    for kind in ("files", "manifest", "webdataset"):
        spec = JobSpec.model_validate({"source": {"kind": kind, "uri": "in", "media": "image",
                                                  "caption_column": "text"},
                                       "sink": {"uri": "out"}})
        assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    spec = load_spec(WEBDATASET, ["source.partition_size=1000"])   # the default: not an error
    assert spec.source.shards_per_partition == 1


def test_a_misspelt_field_gets_a_suggestion_and_an_override_is_named():
    """Issue 16's trial: `max_aspect_ration` said only "Extra inputs are not permitted", and
    errors from `--set` were attributed to the spec file alone."""
    with pytest.raises(SpecError) as e:
        load_spec(QUICKSTART, ["filters.max_aspect_ration=3", "resize.size_px=-3", "sourc.uri=x"])
    lines = str(e.value).splitlines()[1:]
    assert lines == [
        "  resize.size_px: Input should be greater than or equal to 8 (got -3) "
        "[from --set resize.size_px=-3]",
        "  filters.max_aspect_ration: Extra inputs are not permitted (got 3); did you mean "
        "'max_aspect_ratio'? [from --set filters.max_aspect_ration=3]",
        "  sourc: Extra inputs are not permitted (got {'uri': 'x'}); did you mean 'source'? "
        "[from --set sourc.uri=x]"]
    with pytest.raises(SpecError, match=r"'file' does not apply .* \[from --set source.kind=files\]"):
        load_spec(QUICKSTART, ["source.kind=files"], input_uri="data/photos")


def test_cli_version_is_the_installed_distribution(capsys):
    import importlib.metadata

    from pipeline import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"mmpipe {importlib.metadata.version('mmpipe')}\n"
