"""The job spec reference, generated from the pydantic models in ``pipeline.spec``.

``markdown()`` renders every section and field of ``JobSpec`` (dotted name, type, default,
constraints, description), the cross-field rules (the models' validators' docstrings) and
which ``source`` fields apply to which ``source.kind`` (``spec.SOURCE_FIELD_KINDS``).
``docs/spec.md`` is its output, checked in (``tests/test_spec_doc.py`` fails when it is
stale); regenerate it with::

    .venv/bin/python -m pipeline.spec_doc > docs/spec.md      # or: mmpipe spec --markdown

``json_schema()`` is ``JobSpec.model_json_schema()`` (JSON Schema draft 2020-12, pydantic's
dialect) with ``$schema`` set, for editors and other tools (``mmpipe spec --schema``).
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pipeline.spec import SOURCE_FIELD_KINDS, SOURCE_KINDS, JobSpec, SourceSpec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = ".venv/bin/python -m pipeline.spec_doc > docs/spec.md"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (a dict): ``JobSpec.model_json_schema()`` (validation
    mode) plus ``$schema``. Cross-field rules (validators) are not in it: ``mmpipe
    validate`` checks those."""
    return {"$schema": SCHEMA_DIALECT, **JobSpec.model_json_schema()}


def sections(model: type[BaseModel] = JobSpec, prefix: str = ""
             ) -> Iterator[tuple[str, type[BaseModel]]]:
    """``(dotted section name, model class)`` for ``model`` and every nested section, in
    field order, depth first (``""`` is the top level, then ``source``, ``sink``,
    ``sink.webdataset``, ...)."""
    yield prefix, model
    for name, info in model.model_fields.items():
        sub = _section_model(info)
        if sub is not None:
            yield from sections(sub, f"{prefix}{name}.")
        elif _item_model(info) is not None:    # a list of sub-models: `heads[]`, ...
            yield from sections(_item_model(info), f"{prefix}{name}[].")


def fields(model: type[BaseModel] = JobSpec, prefix: str = ""
           ) -> Iterator[tuple[str, FieldInfo]]:
    """``(dotted name, FieldInfo)`` of every leaf field (not a section), e.g.
    ``("source.kind", ...)``, ``("sink.webdataset.enabled", ...)``; a list of sub-models
    is a field and its items' fields follow as ``name[].field``
    (``filters.signals[].column``). A field is named as a spec writes it (its alias:
    ``steps[].with``)."""
    for name, info in model.model_fields.items():
        name = info.alias or name
        sub = _section_model(info)
        if sub is None:
            yield prefix + name, info
            if _item_model(info) is not None:
                yield from fields(_item_model(info), f"{prefix}{name}[].")
        else:
            yield from fields(sub, f"{prefix}{name}.")


def markdown() -> str:
    """The whole reference as Markdown text (``docs/spec.md``), deterministic."""
    out = [
        "# Job spec reference",
        "",
        "<!-- Generated from pipeline/spec/ by `python -m pipeline.spec_doc`; do not edit. -->",
        "",
        "A job is one YAML file validated by the pydantic models in `pipeline/spec/` "
        "(`JobSpec`). Unknown fields are errors; so are `source` fields that the chosen "
        "`source.kind` does not use (see [which source fields apply to which "
        "kind](#which-source-fields-apply-to-which-kind)). `mmpipe validate SPEC` checks a "
        "spec (exit 2 naming the field and the value); `--input`, `--output` and `--set "
        "dotted.key=value` (value in YAML) override fields on any command. "
        f"Regenerate this file with `{REGENERATE}` (or `mmpipe spec --markdown`); "
        "`mmpipe spec --schema` prints the JSON Schema.",
        "",
        "Sections: " + ", ".join(f"[`{name[:-1]}`](#{_anchor(name[:-1])})"
                                 for name, _ in list(sections())[1:]) + ".",
        "",
    ]
    for name, model in sections():
        out += _section(name, model)
        if name == "source.":
            out += _kinds_table()
    return "\n".join(out).rstrip() + "\n"


def _section(prefix: str, model: type[BaseModel]) -> list[str]:
    title = f"`{prefix[:-1]}`" if prefix else "Top level"
    lines = [f"## {title}", "", f"`{model.__name__}`: {_doc(model)}", "",
             "| field | type | default | constraints | description |",
             "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        name = info.alias or name
        sub = _section_model(info)
        item = _item_model(info)
        kind = (f"section [`{prefix}{name}`](#{_anchor(prefix + name)})" if sub else
                f"list of [`{prefix}{name}[]`](#{_anchor(prefix + name + '[]')})" if item
                else _type(info.annotation))
        default = "section defaults" if sub and not info.is_required() else _default(info)
        lines.append("| " + " | ".join([f"`{prefix}{name}`", kind, default, _constraints(info),
                                        _cell(info.description or "")]) + " |")
    rules = _rules(model)
    if rules:
        lines += ["", "Rules:"] + [f"- {r}" for r in rules]
    return lines + [""]


def _kinds_table() -> list[str]:
    lines = ["### Which source fields apply to which kind", "",
             "A `source` field that the kind does not use is an error when the spec sets it "
             "(to a value other than its default), e.g. `source.path_column: 'file' does not "
             "apply to source.kind 'files' (used by: manifest)`. Fields not listed apply to "
             "every kind.", "",
             "| field | " + " | ".join(SOURCE_KINDS) + " |",
             "|---|" + "---|" * len(SOURCE_KINDS)]
    for name, kinds in SOURCE_FIELD_KINDS.items():
        name = SourceSpec.model_fields[name].alias or name
        lines.append(f"| `source.{name}` | " + " | ".join("yes" if k in kinds else "-"
                                                        for k in SOURCE_KINDS) + " |")
    return lines + [""]


def _rules(model: type[BaseModel]) -> list[str]:
    """Docstrings of the model's own ``model_validator``/``field_validator`` methods."""
    decorators = model.__pydantic_decorators__
    found = []
    for group in (decorators.field_validators, decorators.model_validators):
        for dec in group.values():
            if dec.cls_var_name not in vars(model):   # inherited: documented on its class
                continue
            doc = inspect.getdoc(dec.func)
            if doc:
                found.append(_cell(doc))
    return found


def _section_model(info: FieldInfo) -> type[BaseModel] | None:
    ann = info.annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _item_model(info: FieldInfo) -> type[BaseModel] | None:
    """The item model of a list/tuple-of-models field (``tuple[HeadSpec, ...]``), else None."""
    ann = info.annotation
    if typing.get_origin(ann) in (tuple, list):
        item = typing.get_args(ann)[0]
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _doc(model: type[BaseModel]) -> str:
    return " ".join(inspect.cleandoc(model.__doc__ or "").split())


def _type(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [_type(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is tuple:
        return f"list of {_type(args[0])}"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        ann, getattr(ann, "__name__", str(ann)))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value, ensure_ascii=False)}`"


_BOUNDS = ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "≤"), (annotated_types.Lt, "lt", "<"))


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for cls, attr, sign in _BOUNDS:
            if isinstance(meta, cls):
                parts.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, ``|`` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(title: str) -> str:
    """GitHub's heading anchor of a heading that is the code span ``title``."""
    return "".join(c for c in title.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.spec_doc [--schema]``: print the Markdown reference (or the JSON
    Schema) to stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--schema"]:
        print(json.dumps(json_schema(), indent=2, sort_keys=False))
    elif not argv:
        sys.stdout.write(markdown())
    else:
        print("usage: python -m pipeline.spec_doc [--schema]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
