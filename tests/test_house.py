"""The house stays true: the import rules of ``tests/house_rules.py`` hold over every
module, and DESIGN.md's layout tree is the package (issue 24)."""

from __future__ import annotations

import re

import pytest

from tests import house_rules
from tests.conftest import REPO


def test_no_circle_no_upward_import_no_broken_rule():
    found = house_rules.check()
    assert found == {"circles": [], "upward": [], "rules": []}, "\n".join(
        f"{k}: {v}" for k, items in found.items() for v in items)


def test_every_room_has_a_floor():
    rooms = {house_rules.room(m) for m in house_rules.modules()}
    assert rooms <= set(house_rules.FLOORS), rooms - set(house_rules.FLOORS)


@pytest.mark.parametrize("change, expected", [
    ({"storage": 9}, "upward"),                    # storage above everything: every use is upward
    ({"steps": 0}, "upward"),                      # steps on the ground floor, below media
])
def test_the_check_names_an_offending_import(monkeypatch, change, expected):
    monkeypatch.setattr(house_rules, "FLOORS", {**house_rules.FLOORS, **change})
    found = house_rules.check()[expected]
    assert found and all(re.match(r"pipeline/\S+\.py:\d+: imports pipeline\.", f) for f in found)


def test_a_room_pair_that_must_stay_apart_is_reported(monkeypatch):
    monkeypatch.setattr(house_rules, "APART", house_rules.APART | {frozenset(("steps", "media"))})
    rules = house_rules.check()["rules"]
    assert any("pipeline/steps/image.py" in r and "must not import each other" in r
               for r in rules)


def _design_tree() -> set[str]:
    """The ``pipeline/`` files the layout tree of DESIGN.md lists (two spaces per level;
    a name ending in ``/`` is a folder)."""
    text = (REPO / "DESIGN.md").read_text()
    block = text.split("## Layout (what owns what)", 1)[1].split("```", 2)[1]
    stack: list[tuple[int, str]] = []
    files = set()
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or not re.match(r"^[\w.]+/?$", m.group(2)):
            continue
        depth, name = len(m.group(1)) // 2, m.group(2)
        if not (name.endswith("/") or name.endswith(".py")):
            continue                                  # a continuation line's first word
        stack = [s for s in stack if s[0] < depth]
        path = "".join(s[1] for s in stack) + name
        if name.endswith("/"):
            stack.append((depth, name))
        else:
            files.add(path)
    return files


def test_design_md_layout_is_the_package():
    listed = _design_tree()
    present = {str(p.relative_to(REPO)) for p in (REPO / "pipeline").rglob("*.py")
               if p.stat().st_size > 0}                 # empty __init__.py files aside
    assert not present - listed, f"modules missing from DESIGN.md: {sorted(present - listed)}"
    assert not listed - present, f"DESIGN.md lists absent modules: {sorted(listed - present)}"


def test_every_heavy_first_entry_is_a_test_file_once():
    """``HEAVY_FIRST`` (the order ``make test`` hands files to its workers) names real test
    files, each once: a renamed or deleted file would silently fall back to the end."""
    from tests.conftest import HEAVY_FIRST

    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    missing = [p for p in HEAVY_FIRST if not (REPO / p).is_file()
               or not p.rsplit("/", 1)[-1].startswith("test_")]
    assert not missing, missing
