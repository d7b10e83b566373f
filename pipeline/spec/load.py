"""Reading a job spec: ``load_spec(path, overrides)`` reads the YAML (bounded:
``MAX_SPEC_BYTES``, ``MAX_SPEC_NODES``), applies ``--input``/``--output``/``--set`` and
validates it (``parse_spec``); a bad spec raises ``SpecError`` naming the dotted field and
the bad value before anything runs (an unknown field close to a real one: ``did you
mean``).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.errors import MAX_VALUE_CHARS, SpecError, clip, short_repr
from pipeline.spec.base import FieldNotApplicable
from pipeline.spec.job import JobSpec


#: Bounds of a job spec's YAML: its size in bytes, and the nodes (scalars, lists,
#: mappings) it holds once every alias is expanded. A real spec has a few hundred nodes;
#: nested aliases ("billion laughs", CVE-2003-1564's XML entity bomb in YAML) reach
#: billions from a few hundred bytes, and everything downstream (validation, error
#: messages, the fingerprint) walks the expanded value.
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_NODES = 10_000


def _expanded_nodes(root: yaml.Node, origin: str) -> int:
    """Nodes of the YAML graph ``root`` with every alias expanded, counted without
    expanding: each node's count once (memoised), so a few hundred bytes of nested
    aliases cost a few hundred steps. Raises ``SpecError`` once the count passes
    ``MAX_SPEC_NODES``, or for a recursive alias (a node that contains itself)."""
    counts: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(counts[id(c)] for c in _yaml_children(node))
            if total > MAX_SPEC_NODES:
                raise SpecError(f"{origin}: the YAML expands to more than {MAX_SPEC_NODES} "
                                "values (aliases nested inside aliases?); a job spec is "
                                "refused past that", "<yaml>", None)
            counts[key] = total
            continue
        if key in counts:
            continue
        if key in on_path:
            raise SpecError(f"{origin}: a YAML alias refers to a node that contains it "
                            "(a recursive structure): not a job spec", "<yaml>", None)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in counts)
    return counts[id(root)]


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(text: str, origin: str) -> Any:
    """Parse one YAML document with ``yaml.SafeLoader`` (plain data only), bounded: more
    than ``MAX_SPEC_BYTES`` characters, or a document that expands past
    ``MAX_SPEC_NODES`` values through its aliases, raises ``SpecError`` naming
    ``origin`` before anything is constructed. A malformed document raises
    ``yaml.YAMLError``; an empty one gives None."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{origin}: {len(text)} characters; a job spec is at most "
                        f"{MAX_SPEC_BYTES} (1 MiB)", "<yaml>", None)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_nodes(node, origin)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def apply_override(data: dict[str, Any], dotted: str, raw_value: str) -> None:
    """Set ``data[a][b]... = yaml(raw_value)`` for ``dotted`` = ``"a.b..."`` in place
    (the value parsed by ``load_yaml``, bounded like a spec)."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {clip(dotted, MAX_VALUE_CHARS)}: {short_repr(part)} is "
                            "not a section", dotted, raw_value)
        node = child
    try:
        value = load_yaml(raw_value, f"--set {clip(dotted, MAX_VALUE_CHARS)}") \
            if raw_value != "" else ""
    except yaml.YAMLError as e:
        raise SpecError(f"--set {clip(dotted, MAX_VALUE_CHARS)}: not a YAML value: "
                        f"{clip(str(e), 500)}", dotted, raw_value) from None
    node[parts[-1]] = value


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The spec model of the section at ``loc`` (``("source",)`` -> ``SourceSpec``), or None."""
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        model = next((c for c in candidates
                      if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def _did_you_mean(loc: tuple) -> str:
    """``; did you mean 'x'?`` for an unknown field close to a real one (``difflib``), or ""."""
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_spec(data: Any, origin: str = "<spec>", given: dict[str, str] | None = None) -> JobSpec:
    """Validate a spec mapping; raise ``SpecError`` naming the first bad field and value
    (every bad field is a line of its message; an unknown field close to a real one gets
    ``did you mean``). ``given``: dotted field -> the command-line option that set it
    (``--set k=v``, ``--input``), named on that field's line."""
    given = given or {}
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: a job spec must be a mapping, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        lines, where = [], []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "<root>"
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldNotApplicable):
                for field, value, message in cause.problems:
                    name = field if loc == "<root>" else f"{loc}.{field}"
                    flag = next((f" [from {given[k]}]" for k in (name, f"{loc}.kind")
                                 if k in given), "")
                    lines.append(clip(f"{name}: {message}{flag}", 1000))
                    where.append((name, value))
                continue
            hint = _did_you_mean(err["loc"]) if err["type"] == "extra_forbidden" else ""
            opt = given.get(loc) or next((v for k, v in given.items()
                                          if k.startswith(loc + ".")), None)
            flag = f" [from {opt}]" if opt else ""
            lines.append(clip(f"{clip(loc, MAX_VALUE_CHARS)}: {clip(err['msg'], 500)} "
                              f"(got {short_repr(err.get('input'))}){hint}{flag}", 1000))
            where.append((".".join(str(p) for p in err["loc"]), err.get("input")))
        raise SpecError(f"{origin}: invalid job spec:\n  " + "\n  ".join(lines),
                        *where[0]) from None


def load_spec(path: str | Path, overrides: list[str] = (), input_uri: str | None = None,
              output_uri: str | None = None) -> JobSpec:
    """Read a YAML spec, apply ``--input``/``--output``/``--set key=value``, validate.

    Raises ``SpecError`` for unreadable YAML, a malformed override or an invalid field.
    """
    try:
        with open(path, encoding="utf-8") as f:   # never more than the bound + 1 read
            data = load_yaml(f.read(MAX_SPEC_BYTES + 1), str(path))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: cannot read job spec: {clip(str(e), 1000)}") from None
    data = data if data is not None else {}
    given: dict[str, str] = {}
    if isinstance(data, dict):
        if input_uri:
            data.setdefault("source", {})["uri"] = input_uri
            given["source.uri"] = "--input"
        if output_uri:
            data.setdefault("sink", {})["uri"] = output_uri
            given["sink.uri"] = "--output"
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SpecError(f"--set {short_repr(item)}: expected dotted.key=value",
                                item, item)
            apply_override(data, key.strip(), value)
            given[key.strip()] = f"--set {item}"
    return parse_spec(data, str(path), given)
