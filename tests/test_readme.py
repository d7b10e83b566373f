"""README.md's commands, run as written (issue 16: every README command works on a fresh
machine, without activating the virtual environment).

Every fenced ``bash`` block is cut into commands (a line with its ``\\`` continuations;
comments stay, bash drops them); every ``python`` block is one snippet, run with
``.venv/bin/python``. They run in README order in a scratch checkout: the repository's
top-level entries symlinked into a temporary directory (so a relative output such as
``output/quickstart`` lands there), HOME isolated, no ``RAY_*`` variables, a PATH without
the virtual environment, and absolute ``/tmp/`` paths moved into the scratch directory.
``make`` runs with ``-o .venv/.mmpipe-runtime -o .venv/.mmpipe-installed`` (the venv this
suite runs in is not reinstalled).

- ``SKIPPED``: commands that cannot run here, by how they start, with the reason; the
  tests assert that every entry still matches a README command.
- Job commands (``JOB``: they start Ray and run a whole job, 30-60 s each on 2 cores)
  run in the default suite only when a later command reads their output (today: ``make
  quickstart``, which also runs ``mmpipe status``, read by the README's Python snippet;
  about 35-50 s; and ``examples/video_clips.yaml`` with its tiny models, read back by the
  "Video clips" snippet, about 60 s); ``-m slow`` runs every command (about 8 minutes on
  2 cores).
- Every other command (``validate``, ``status``, ``ls``, ``spec``, Python snippets) always runs.
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
OUTPUT = re.compile(r"\boutput/[\w.-]+")


@dataclasses.dataclass(frozen=True)
class Command:
    """One README command: ``language`` (``bash`` or ``python``), its text, its line."""

    language: str
    text: str
    line: int

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
        if "examples/make_tiny_models.py" in self.text:
            return set(re.findall(r"--out\s+(\S+)", self.text)) or {"output/tiny-models"}
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


def readme_commands() -> list[Command]:
    """Every command of README.md's ``bash`` and ``python`` fenced blocks, in order."""
    out, block, language, start = [], None, "", 0
    for n, line in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block, language, start = [], line[3:].strip(), n + 1
                continue
            if language == "python":
                out.append(Command("python", "\n".join(block), start))
            elif language == "bash":
                out += _bash_commands(block, start)
            block = None
        elif block is not None:
            block.append(line)
    return out


def _bash_commands(lines: list[str], start: int) -> list[Command]:
    out, current, first = [], "", start
    for n, line in enumerate(lines, start):
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not current:
            first = n
        current += line + "\n"
        if not line.rstrip().endswith("\\"):
            out.append(Command("bash", current.strip(), first))
            current = ""
    return out


def runnable(commands: list[Command], everything: bool) -> list[Command]:
    """The commands to run: all not skipped (``everything``), else the quick ones and the
    job commands whose output a later command reads."""
    todo = [c for c in commands if c.skip_reason is None]
    if everything:
        return todo
    keep = []
    for i, c in enumerate(todo):
        later_reads = set().union(*(d.outputs_read() for d in todo[i + 1:]))
        if not c.is_job or c.outputs_written() & later_reads:
            keep.append(c)
    return keep


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
    """Run one README command in ``root``; assert it exits 0; return (seconds, output)."""
    text = cmd.text.replace("/tmp/", f"{root}/tmp/")
    if cmd.language == "python":
        argv = [str(root / ".venv" / "bin" / "python"), "-c", text]
    else:
        text = re.sub(r"^make (\w+)", r"make -o .venv/.mmpipe-runtime -o .venv/.mmpipe-installed \1", text)
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    t0 = time.time()
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    took = time.time() - t0
    assert done.returncode == 0, (f"README.md line {cmd.line}: {cmd.text}\nexit "
                                  f"{done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return took, done.stdout + done.stderr


def test_readme_blocks_are_found_and_the_skip_list_is_what_is_skipped():
    commands = readme_commands()
    assert any(c.language == "python" for c in commands)
    assert any(c.is_job for c in commands) and any(not c.is_job for c in commands)
    skipped = [c for c in commands if c.skip_reason]
    for start in SKIPPED:      # every entry still names a README command
        assert any(c.text.startswith(start) for c in skipped), f"stale SKIPPED entry {start!r}"
    assert not [c for c in commands if c.skip_reason is None and c.language == "bash" and
                re.search(r"\b(docker|kubectl|helm)\b", c.text)], \
        "a cluster command is not in SKIPPED"   # (a python snippet may copy the binaries)


def _run_all(checkout: Path, everything: bool) -> None:
    env = user_env(checkout)
    for cmd in runnable(readme_commands(), everything):
        took, _ = run_command(cmd, checkout, env)
        print(f"README.md:{cmd.line} {took:5.1f}s  {cmd.text.splitlines()[0][:90]}")


def test_readme_commands_run_as_written(checkout):
    """The quick commands, and the jobs whose outputs they read (see the module doc)."""
    _run_all(checkout, everything=False)


@pytest.mark.slow
def test_every_readme_command_runs_as_written(checkout):
    _run_all(checkout, everything=True)


def test_the_clip_blip_example_runs_on_its_folder_as_the_readme_says(checkout):
    """README "Model steps": the tiny-model maker, then `mmpipe run examples/clip_blip.yaml`
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
