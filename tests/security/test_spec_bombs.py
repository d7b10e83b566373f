"""Attacks on the spec loader: YAML alias bombs ("billion laughs") and values that would
make an error message unbounded. A spec is refused fast, in bounded memory, with a short
message naming the file (``pipeline.spec.load_yaml``, ``pipeline.errors.short_repr``)."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc

import pytest

from pipeline.errors import SpecError
from pipeline.spec import MAX_SPEC_NODES, load_spec
from tests.conftest import REPO


def _laughs(levels: int = 9, width: int = 9) -> str:
    """The classic bomb: each level a list of ``width`` aliases of the one before
    (``width ** levels`` strings once expanded: 387 million for 9 x 9), under a field
    whose type is wrong, so that a loader that expands it also prints it."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ",".join(f"*a{i - 1}" for _ in range(width)) + "]")
    lines += ["name: bomb", "source: {kind: files, uri: in}", "sink: {uri: out}",
              f"resize: {{size_px: *a{levels}}}"]
    return "\n".join(lines) + "\n"


def _merge_laughs(levels: int = 12) -> str:
    """The same with merge keys (``<<``): each mapping merges the one before twice."""
    lines = ["m0: &m0 {k0: v}"]
    for i in range(1, levels + 1):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: v}}")
    lines += ["name: bomb", "source: {kind: files, uri: in}", "sink: {uri: out}",
              f"captions: *m{levels}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [_laughs(), _merge_laughs(), "a: &a [*a]\n"],
                         ids=["nested-aliases", "merge-keys", "recursive"])
def test_alias_bomb_is_refused_fast_in_bounded_memory(tmp_path, text):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(text)
    assert len(text) < 1000
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(SpecError) as e:
            load_spec(spec)
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert elapsed < 5, elapsed
    assert peak < 20 * 2**20, peak          # bytes: the graph is walked, never expanded
    assert str(spec) in message and len(message) < 500, message
    assert ("expands to more than" in message and str(MAX_SPEC_NODES) in message) or \
        "recursive" in message


def test_validate_refuses_the_bomb_with_exit_2_and_one_short_line(tmp_path):
    """The attack as reported: a 700-byte spec given to `mmpipe validate` (it ran > 120 s
    at 2.5 GB, printing the expanded value)."""
    spec = tmp_path / "bomb.yaml"
    spec.write_text(_laughs())
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pipeline", "validate", str(spec)],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert time.monotonic() - t0 < 30           # seconds, Python's start included
    assert out.stderr.startswith(f"error: {spec}: the YAML expands to more than")
    assert len(out.stderr) < 500 and "Traceback" not in out.stderr, out.stderr


def test_an_alias_used_a_few_times_still_loads(tmp_path):
    """Aliases within the bound are ordinary YAML and keep working."""
    spec = tmp_path / "ok.yaml"
    spec.write_text("name: ok\nsource: {kind: files, uri: in, extensions: &e [.jpg, .png]}\n"
                    "sink: {uri: out}\nresize: {size_px: &s 128}\n"
                    "filters: {min_width_px: *s, min_height_px: *s}\n")
    got = load_spec(spec)
    assert got.resize.size_px == got.filters.min_width_px == got.filters.min_height_px == 128
    assert got.source.extensions == (".jpg", ".png")


def test_a_huge_value_is_not_printed_whole(tmp_path):
    """A wrong value of 100,000 characters (and a list of 5,000 of them through one
    alias, within the node bound) gives a message of a few hundred characters."""
    spec = tmp_path / "big.yaml"
    big = "x" * 100_000
    spec.write_text(f"name: big\nsource: {{kind: files, uri: in, partition_size: {big}}}\n"
                    f"sink: {{uri: out}}\n")
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    message = str(e.value)
    assert "source.partition_size" in message and len(message) < 800, len(message)
    assert "xxxx" in message and big not in message
    spec.write_text(f"v: &v {big}\nname: big\nsource: {{kind: files, uri: in}}\n"
                    "sink: {uri: out}\nresize: {size_px: [" + ", ".join(["*v"] * 5000) + "]}\n")
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert "resize.size_px" in str(e.value) and len(str(e.value)) < 800, len(str(e.value))


def test_a_spec_file_over_the_size_bound_is_refused(tmp_path):
    spec = tmp_path / "huge.yaml"
    spec.write_text("name: huge\n# " + "y" * (2 << 20) + "\n")
    with pytest.raises(SpecError, match="a job spec is at most"):
        load_spec(spec)


def test_a_set_override_is_bounded_too(tmp_path):
    """``--set key=VALUE`` parses VALUE as YAML: the same bound applies."""
    spec = tmp_path / "ok.yaml"
    spec.write_text("name: ok\nsource: {kind: files, uri: in}\nsink: {uri: out}\n")
    levels = ["a0: &a0 [lol]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
                                  for i in range(1, 10)]
    t0 = time.monotonic()
    with pytest.raises(SpecError) as e:
        load_spec(spec, ["resize.size_px={" + ", ".join(levels) + "}"])
    assert time.monotonic() - t0 < 5
    assert str(e.value).startswith("--set resize.size_px: the YAML expands to more than")
    assert len(str(e.value)) < 500
