"""The house rules over ``pipeline/``'s imports: rooms, floors, no circles.

Run as a script (``python tests/house_rules.py``) it prints the number of circles, upward
imports and rule breaks, each offending import on its own line, and exits 1 if any;
``tests/test_house.py`` asserts the same. Every import counts, lazy ones (inside a
function) and ``TYPE_CHECKING`` ones included: a lazy import does not make a circle go
away.

Rooms and their floors (a module may import its own room and rooms on lower floors; a
room is a top-level module or package of ``pipeline/``, so every module of the package
``pipeline/spec/`` is the room ``spec``):

  0  ground    columns, records, errors, keys, text, spec, spec_doc, contracts, stats,
               plugins
  1  storage   bytes and URIs, no record and no job
  1  media     pure codecs over bytes and arrays, no batches and no I/O
  2  input     what a record is and where it came from; never writes under the output
  2  output    everything under <output>/; never reads the input
  2  calibration  signal thresholds from labels: curves, _calibration/ files (no reading of rows)
  3  steps     batch -> batch, no I/O, no ray
  3  dedup     the dataset-wide dedup pass's pure parts and its files under the output
  4  models    model backends and serving (torch lazily)
  4  read      the reader's face: read_output, committed_files, read_committed
  5  assembly  JobSpec -> Pipeline
  6  runtime   Ray actors, the driver, metrics, submission
  7  cli
  8  testing   scaffolding for tests and examples
"""

from __future__ import annotations

import ast
import pathlib
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipeline"

GROUND = ("columns", "records", "errors", "keys", "text", "spec", "spec_doc", "contracts",
          "stats", "plugins")
FLOORS = {**{g: 0 for g in GROUND}, "storage": 1, "media": 1, "input": 2, "output": 2,
          "calibration": 2,
          "steps": 3, "dedup": 3, "models": 4, "read": 4, "assembly": 5, "runtime": 6,
          "cli": 7, "testing": 8, "__main__": 8, "": 8}
#: Rooms on the same floor that must not import each other.
APART = {frozenset(p) for p in (("storage", "media"), ("input", "output"), ("steps", "dedup"),
                                ("models", "read"), ("models", "steps"))}
#: Rooms that may import ray.
RAY_ROOMS = ("runtime", "models", "testing")
#: Rooms steps must not import (I/O).
IO_ROOMS = ("storage", "input", "output", "read")


def modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def room(module: str) -> str:
    """``pipeline.output.sinks.parquet`` -> ``output``; ``pipeline`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports(mods: dict[str, pathlib.Path]) -> Iterator[tuple[str, str, int, str]]:
    """``(importer, imported module, line, source text)`` for every import of a
    ``pipeline`` module (a ``from X import name`` of a submodule names the submodule), and
    ``ray`` imports as imported module ``"ray"``."""
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                if t == "ray" or t.startswith("ray."):
                    yield name, "ray", node.lineno, t
                elif t == "pipeline" or t.startswith("pipeline."):
                    while t not in mods and "." in t:
                        t = t.rpartition(".")[0]
                    if t != name:
                        yield name, t, node.lineno, t


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check() -> dict[str, list[str]]:
    """``{"circles": [...], "upward": [...], "rules": [...]}``: one message per finding,
    naming the importing file, line and the import."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    upward, rules = [], []
    for src, dst, line, text in imports(mods):
        where = f"{mods[src].relative_to(ROOT)}:{line}: imports {text}"
        a = room(src)
        if dst == "ray":
            if a not in RAY_ROOMS:
                rules.append(f"{where} (only {', '.join(RAY_ROOMS)} import ray)")
            continue
        edges.setdefault(src, set()).add(dst)
        b = room(dst)
        if a == b or dst == "pipeline":
            continue
        if a not in FLOORS or b not in FLOORS:
            rules.append(f"{where} (room {a or b!r} is in no floor of tests/house_rules.py)")
        elif FLOORS[b] > FLOORS[a]:
            upward.append(f"{where} ({a} is on floor {FLOORS[a]}, {b} on {FLOORS[b]})")
        elif frozenset((a, b)) in APART:
            rules.append(f"{where} ({a} and {b} must not import each other)")
        elif a == "steps" and b in IO_ROOMS:
            rules.append(f"{where} (steps do no I/O)")
    return {"circles": [" -> ".join(c) for c in circles(edges)], "upward": upward,
            "rules": rules}


def main() -> int:
    found = check()
    for kind, items in found.items():
        print(f"{kind}: {len(items)}")
        for item in items:
            print(f"  {item}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
