"""The generated spec reference: docs/spec.md is current, every field is described, and
``mmpipe spec --schema`` prints a JSON Schema that the bundled specs validate against."""

from __future__ import annotations

import json

import jsonschema
import yaml

from pipeline import spec_doc
from tests.conftest import REPO
from tests import inproc

SPECS = sorted([*(REPO / "examples").glob("*.yaml"), *(REPO / "deploy" / "jobs").glob("*.yaml")])


def test_docs_spec_md_is_current():
    checked_in = (REPO / "docs" / "spec.md").read_text(encoding="utf-8")
    assert checked_in == spec_doc.markdown(), (
        f"docs/spec.md is stale: regenerate it with `{spec_doc.REGENERATE}`")


def test_every_field_and_section_is_described_in_the_reference():
    text = spec_doc.markdown()
    names = [name for name, _ in spec_doc.fields()]
    assert len(names) >= 83 and "source.kind" in names and "sink.webdataset.enabled" in names
    undescribed = [name for name, info in spec_doc.fields() if not (info.description or "").strip()]
    assert undescribed == []
    for name in names:
        assert f"| `{name}` |" in text, name
    for section, model in list(spec_doc.sections())[1:]:
        assert f"## `{section[:-1]}`" in text and (model.__doc__ or "").strip(), section
    # the applicability table is there, one row per kind-specific source field
    assert "| `source.path_column` | - | yes | - |" in text


def test_cli_prints_the_json_schema_and_the_bundled_specs_validate(tmp_path, capsys):
    out = inproc.command(capsys, "spec", "--schema")
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    assert schema["$schema"] == spec_doc.SCHEMA_DIALECT and schema["required"] == ["source", "sink"]
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    assert len(SPECS) >= 7
    for path in SPECS:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], (path.name, errors)
    bad = yaml.safe_load((REPO / "examples" / "images.yaml").read_text())
    bad["resize"]["sise_px"] = 128
    bad["source"]["kind"] = "ftp"
    messages = sorted(e.message for e in validator.iter_errors(bad))
    assert len(messages) == 2 and "'ftp' is not one of" in messages[0], messages
    assert "'sise_px' was unexpected" in messages[1], messages
    md = inproc.command(capsys, "spec")
    assert md.returncode == 0 and md.stdout == spec_doc.markdown()
