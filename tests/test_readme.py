"""The commands of README.md and the user guide in docs/, run as written: every command works
on a fresh machine, without activating the virtual environment.

The documents are README.md, then docs/README.md (the contents page), then every page the
contents page links, in its order: one sequence, so a command on a later page may read the
output of a job on an earlier one. Every fenced ``bash`` block is cut into commands (a line
with its ``\\`` continuations; comments stay, bash drops them); every ``python`` block is one
snippet, run with ``.venv/bin/python``. They run in that order in a scratch checkout: the
repository's top-level entries symlinked into a temporary directory (so a relative output such
as ``output/quickstart`` lands there), HOME isolated, no ``RAY_*`` variables, a PATH without
the virtual environment, and absolute ``/tmp/`` paths moved into the scratch directory.
``make`` runs with ``-o .venv/.mmpipe-runtime -o .venv/.mmpipe-installed`` (the venv this
suite runs in is not reinstalled). A failure names the document and line
(``docs/video.md line 40: ...``).

- ``SKIPPED``: commands that cannot run here, by how they start, with the reason; the
  tests assert that every entry still matches a command of some document.
- Job commands (``JOB``: they start Ray or worker processes and run a whole job, 30-60 s each
  on 2 cores) run in the default suite only when a later command reads their output (today:
  ``make quickstart``, which also runs ``mmpipe status``, read by the README's Python snippet
  and docs/output.md's Delta snippet; the clips job of docs/video.md with its tiny models; the
  quality job read by ``mmpipe calibrate``; the dedup job read by its snippet; and every
  ``make_tiny_models.py`` that a later job's spec reads); ``-m slow`` runs every command
  (about 8 minutes on 2 cores).
- Every other command (``validate``, ``status``, ``ls``, ``spec``, Python snippets) always runs.
- The README stays a front door (at most 250 lines), every page of docs/ is on the contents
  page, relative links resolve (files and ``#anchors``), and no document cites issue numbers.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.e2e.jobs import clean_ray_env

VENV_BIN = Path(sys.executable).parent
SKIPPED = {  # how a command starts -> why it cannot run here
    "make test": "the default test suite itself (this test is part of it)",
    "docker ": "needs a Docker engine and a registry",
    "helm ": "needs a Kubernetes cluster with the KubeRay operator",
    "kubectl ": "needs a Kubernetes cluster",
    "export RAY_AUTH_TOKEN=$(kubectl": "needs a Kubernetes cluster",
    "mmpipe submit deploy/jobs/coco-s3.yaml": "needs the KubeRay cluster and its S3 bucket",
    "mmpipe logs mmpipe-coco-s3-": "needs the KubeRay cluster's job",
    "mmpipe stop mmpipe-coco-s3-": "needs the KubeRay cluster's job",
    # the local head recipe: its default temp dir is one per user, shared by every test
    # run on this machine; tests/deploy/test_local_head.py runs these commands with a temp
    # dir of its own, next to another Ray
    ".venv/bin/mmpipe head start": "tests/deploy/test_local_head.py",
    ".venv/bin/mmpipe submit examples/quickstart.yaml": "tests/deploy/test_local_head.py",
    ".venv/bin/mmpipe head stop": "tests/deploy/test_local_head.py",
    # the plugin example is installed into a temporary --target there, never into this venv
    ".venv/bin/pip install examples/plugin": "tests/test_plugins.py (installs the example)",
    ".venv/bin/mmpipe validate --explain examples/plugin/": "tests/test_plugins.py",
    ".venv/bin/mmpipe run examples/plugin/": "tests/test_plugins.py",
    "import ray  # Ray Data": "tests/runtime/test_foreign_ray.py (with another Ray registered)",
    # --keep-dashboard waits for Ctrl-C; mmpipe metrics reads a running job's endpoint
    ".venv/bin/mmpipe run examples/quickstart.yaml --keep-dashboard":
        "tests/runtime/test_dashboard.py (runs it and stops it with SIGINT)",
    ".venv/bin/mmpipe metrics": "tests/runtime/test_dashboard.py (during a kept dashboard)",
}
JOB = re.compile(r"\bmmpipe run\b|\bmake quickstart\b|"
                 r"examples/(url_manifest|s3_local|make_tiny_models)\.py")
OUTPUT = re.compile(r"\boutput/[\w.-]+(?:/[\w.-]+)*")


def overlapping(reads: set[str], writes: set[str]) -> set[str]:
    """The paths of ``reads`` that one of ``writes`` provides: the same path, or one inside
    a written directory (``output/tiny-models/tiny-heads/nsfw.safetensors`` in
    ``output/tiny-models/tiny-heads``), or a directory holding a written path."""
    return {r for r in reads for w in writes
            if r == w or r.startswith(w + "/") or w.startswith(r + "/")}


@dataclasses.dataclass(frozen=True)
class Command:
    """One documented command: ``language`` (``bash`` or ``python``), its text, its line, and
    the document it came from (relative to the repository: ``README.md``, ``docs/video.md``)."""

    language: str
    text: str
    line: int
    file: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.file} line {self.line}"

    @property
    def skip_reason(self) -> str | None:
        return next((why for start, why in SKIPPED.items() if self.text.startswith(start)),
                    None)

    @property
    def is_job(self) -> bool:
        return self.language == "bash" and bool(JOB.search(self.text))

    def outputs_written(self) -> set[str]:
        """Relative outputs a job command writes: ``--output X`` (``--out X`` for
        ``make_tiny_models.py``, default ``output/tiny-models``), else the sink.uri of the
        specs it names (for ``make TARGET``: the specs in the target's recipe)."""
        given = re.findall(r"--output\s+(\S+)", self.text)
        if given:
            return set(given)
        if "examples/make_tiny_models.py" in self.text:   # one directory per model built
            from pipeline.testing.tiny_models import NAMES
            root = (re.findall(r"--out\s+(\S+)", self.text) or ["output/tiny-models"])[0]
            only = re.findall(r"--only\s+(\S+)", self.text)
            return {f"{root}/{name}" for name in (only[0].split(",") if only else NAMES)}
        text = self.text
        for target in re.findall(r"\bmake\s+(\w+)", text):
            text += "\n" + make_recipe(target)
        return {yaml.safe_load((REPO / spec).read_text())["sink"]["uri"]
                for spec in re.findall(r"examples/[\w.-]+\.yaml", text)}

    def outputs_read(self) -> set[str]:
        """Outputs a command reads: the ``output/...`` paths in its text (a job: none of its
        own, but those its specs name other than their sink, e.g. ``output/tiny-models``)."""
        if not self.is_job:
            return set(OUTPUT.findall(self.text))
        read = set()
        for spec in re.findall(r"examples/[\w.-]+\.yaml", self.text):
            text = (REPO / spec).read_text()
            sink = yaml.safe_load(text)["sink"]["uri"]
            read |= {p for p in OUTPUT.findall(text) if p != sink}
        return read


def make_recipe(target: str) -> str:
    """The recipe lines of a Makefile target."""
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    return match.group(1) if match else ""


DOCS = REPO / "docs"
CONTENTS = DOCS / "README.md"
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _relative_links(markdown: str) -> list[str]:
    """The targets of a document's Markdown links outside code (fenced blocks, inline code),
    but external ones (``http(s)://``, ``mailto:``)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z+.-]*:", t)]


def documents() -> list[Path]:
    """README.md, the contents page, then the docs/ pages the contents page links, in its order
    (each once)."""
    pages = []
    for target in _relative_links(CONTENTS.read_text()):
        path = Path(os.path.normpath(DOCS / target.split("#")[0]))
        if path.parent == DOCS and path.suffix == ".md" and path != CONTENTS and path not in pages:
            pages.append(path)
    return [REPO / "README.md", CONTENTS, *pages]


def document_commands(path: Path) -> list[Command]:
    """Every command of one document's ``bash`` and ``python`` fenced blocks, in order."""
    name = path.relative_to(REPO).as_posix()
    out, block, language, start = [], None, "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block, language, start = [], line[3:].strip(), n + 1
                continue
            if language == "python":
                out.append(Command("python", "\n".join(block), start, name))
            elif language == "bash":
                out += _bash_commands(block, start, name)
            block = None
        elif block is not None:
            block.append(line)
    return out


def readme_commands() -> list[Command]:
    """Every command of README.md and the docs/ pages, in ``documents()`` order (other tests
    look commands up here by their text, wherever a page holds them)."""
    return [c for doc in documents() for c in document_commands(doc)]


def _bash_commands(lines: list[str], start: int, file: str) -> list[Command]:
    out, current, first = [], "", start
    for n, line in enumerate(lines, start):
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not current:
            first = n
        current += line + "\n"
        if not line.rstrip().endswith("\\"):
            out.append(Command("bash", current.strip(), first, file))
            current = ""
    return out


def runnable(commands: list[Command], everything: bool) -> list[Command]:
    """The commands to run: all not skipped (``everything``), else the quick ones and the
    job commands whose output a later command reads."""
    todo = [c for c in commands if c.skip_reason is None]
    if everything:
        return todo
    keep: list[Command] = []
    needed: set[str] = set()   # what the commands kept after this one read, unwritten between
    for c in reversed(todo):   # (a job that only a skipped job reads is skipped too)
        written = c.outputs_written() if c.is_job else set()
        if not c.is_job or overlapping(needed, written):
            keep.append(c)   # reads inside what it writes need nothing earlier
            needed = {r for r in needed if not any(r == w or r.startswith(w + "/")
                                                   for w in written)} | c.outputs_read()
    return keep[::-1]


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A scratch checkout: the repository's top-level entries (but ``output``) symlinked,
    ``examples/`` copied (its scripts find the checkout from their own resolved path)."""
    root = tmp_path / "checkout"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name == "examples":
            shutil.copytree(entry, root / entry.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name not in ("output", ".git"):
            (root / entry.name).symlink_to(entry)
    (root / "tmp").mkdir()
    return root


def user_env(root: Path) -> dict[str, str]:
    """A new user's shell: no venv on PATH (nor VIRTUAL_ENV), no RAY_*, HOME in ``root``."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != VENV_BIN.resolve()]
    env = clean_ray_env(PATH=os.pathsep.join(path), HOME=str(root / "home"))
    env.pop("VIRTUAL_ENV", None)
    (root / "home").mkdir(exist_ok=True)
    return env


def run_command(cmd: Command, root: Path, env: dict[str, str]) -> tuple[float, str]:
    """Run one documented command in ``root``; assert it exits 0; return (seconds, output)."""
    text = cmd.text.replace("/tmp/", f"{root}/tmp/")
    if cmd.language == "python":
        argv = [str(root / ".venv" / "bin" / "python"), "-c", text]
    else:
        text = re.sub(r"^make (\w+)", r"make -o .venv/.mmpipe-runtime -o .venv/.mmpipe-installed \1", text)
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    t0 = time.time()
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    took = time.time() - t0
    assert done.returncode == 0, (f"{cmd.where}: {cmd.text}\nexit "
                                  f"{done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return took, done.stdout + done.stderr


def test_readme_blocks_are_found_and_the_skip_list_is_what_is_skipped():
    commands = readme_commands()
    assert any(c.language == "python" for c in commands)
    assert any(c.is_job for c in commands) and any(not c.is_job for c in commands)
    skipped = [c for c in commands if c.skip_reason]
    for start in SKIPPED:      # every entry still names a command of some document
        assert any(c.text.startswith(start) for c in skipped), f"stale SKIPPED entry {start!r}"
    assert {c.file for c in commands} > {"README.md"}, "no command found in docs/"
    assert not [c for c in commands if c.skip_reason is None and c.language == "bash" and
                re.search(r"\b(docker|kubectl|helm)\b", c.text)], \
        "a cluster command is not in SKIPPED"   # (a python snippet may copy the binaries)


def _run_all(checkout: Path, everything: bool) -> None:
    env = user_env(checkout)
    for cmd in runnable(readme_commands(), everything):
        took, _ = run_command(cmd, checkout, env)
        print(f"{cmd.file}:{cmd.line} {took:5.1f}s  {cmd.text.splitlines()[0][:90]}")


def test_readme_commands_run_as_written(checkout):
    """The quick commands, and the jobs whose outputs they read (see the module doc)."""
    _run_all(checkout, everything=False)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(checkout):
    _run_all(checkout, everything=True)


def test_the_clip_blip_example_runs_on_its_folder_as_the_readme_says(checkout):
    """docs/models.md: the tiny-model maker, then `mmpipe run examples/clip_blip.yaml`
    with no override: it reads the photo folder (57 images with caption sidecars), runs
    CLIP + score filter + BLIP and the dataset-wide dedup pass."""
    commands = [c for c in readme_commands() if c.language == "bash" and (
        c.text.startswith(".venv/bin/python examples/make_tiny_models.py      #")
        or c.text.startswith(".venv/bin/mmpipe run examples/clip_blip.yaml"))]
    assert [c.text.split()[1] for c in commands] == ["examples/make_tiny_models.py", "run"]
    assert "--set" not in commands[1].text
    env = user_env(checkout)
    run_command(commands[0], checkout, env)
    _, out = run_command(commands[1], checkout, env)
    assert "job 'clip-blip': complete" in out and "input: 57 objects, 57 records planned" in out
    rows = re.search(r"rows: ok=(\d+) rejected=(\d+) error=(\d+)", out)
    assert rows and sum(map(int, rows.groups())) == 57 and rows.group(3) == "0", out
    assert re.search(r"dedup \S+: generation 1, 4 partitions \(4 new\)", out), out
    assert "duplicates: 0 (none)" in out


def _reads(cmd: Command) -> set[str]:
    """What a command reads, for the order check: a job only what its specs' values name
    (``outputs_read`` also counts paths in the specs' comments, which is harmless there)."""
    if not cmd.is_job:
        return cmd.outputs_read()

    def strings(node):
        if isinstance(node, dict):
            return [s for v in node.values() for s in strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    read = set()
    for spec in re.findall(r"examples/[\w.-]+\.yaml", cmd.text):
        values = yaml.safe_load((REPO / spec).read_text())
        read |= {p for v in strings(values) for p in OUTPUT.findall(v)} - {values["sink"]["uri"]}
    return read


def test_no_command_reads_an_output_a_later_job_writes():
    """The order of the documents matters: a command that reads ``output/X`` (a snippet, a
    ``mmpipe status``, a spec naming ``output/tiny-models``) comes after the job that writes it,
    never before (in the default suite, that job would then not run before it)."""
    commands = runnable(readme_commands(), everything=True)
    for i, cmd in enumerate(commands):
        earlier = set().union(*(c.outputs_written() for c in commands[:i] if c.is_job))
        later = set().union(*(c.outputs_written() for c in commands[i + 1:] if c.is_job))
        reads = _reads(cmd)
        early = overlapping(reads, later) - overlapping(reads, earlier)
        assert not early, f"{cmd.where} reads {sorted(early)} before the job that writes it"


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move details to docs/")
    assert lines[2:6] == ["```bash", lines[3], lines[4], "```"] and \
        lines[3].startswith("make quickstart") and lines[4].startswith("make test"), lines[:6]


def test_every_docs_page_is_on_the_contents_page():
    listed = set(documents())
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p not in listed]
    assert not unlisted, f"docs/README.md does not link {unlisted}"


def test_no_document_cites_issue_numbers():
    for doc in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            assert not re.search(r"\b[Ii]ssues? #?\d+", line), \
                f"{doc.relative_to(REPO)} line {n}: {line.strip()}"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``, a repeat suffixed ``-1``, ``-2``, ...)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_relative_links_resolve():
    """Every relative link of README.md and docs/ names a file that exists and, with a
    ``#anchor``, a heading of that Markdown file."""
    broken = []
    for doc in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in _relative_links(doc.read_text()):
            path, _, anchor = target.partition("#")
            dest = Path(os.path.normpath(doc.parent / path)) if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text()):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
