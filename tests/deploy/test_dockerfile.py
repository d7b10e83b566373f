"""The Dockerfile, checked without a Docker engine: parsed by BuildKit's own parser (the
``dockerfile`` package), linted by hadolint, and compared with what it must agree with:
the Ray version pinned in pyproject.toml, the install steps of the Makefile/README, the
non-root user, and the build context (.dockerignore)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest
import ray
import yaml

from tests.conftest import REPO

BASE = re.compile(r"^rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-(?P<py>py3\d+)"
                  r"-(?P<variant>cu\d{3}|cpu)$")


@pytest.fixture(scope="module")
def instructions():
    return dockerfile.parse_file(str(REPO / "Dockerfile"))


def arg_defaults(instructions, build_args: dict[str, str]) -> dict[str, str]:
    """ARG defaults (global and stage), with ``build_args`` overriding, ${} expanded."""
    out: dict[str, str] = {}
    for ins in instructions:
        if ins.cmd == "ARG":
            name, _, default = ins.value[0].partition("=")
            out[name] = build_args.get(name, out.get(name, expand(default, out)))
    return out


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), text)


def base_image(instructions, **build_args) -> str:
    (frm,) = [i for i in instructions if i.cmd == "FROM"]
    return expand(frm.value[0], arg_defaults(instructions, build_args))


def pinned_ray_version() -> str:
    """The ``ray[...]==X.Y.Z`` pin of pyproject.toml (no tomllib: Python 3.10 is supported)."""
    text = (REPO / "pyproject.toml").read_text()
    (version,) = re.findall(r'^\s*"ray\[[^\]]*\]==([0-9.]+)"', text, re.M)
    return version


def pip_installs(commands: list[str]) -> list[list[str]]:
    """The arguments of each ``pip install`` in shell command lines (options dropped)."""
    out = []
    for line in commands:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        parts, words = [], []
        for token in lexer:
            if token in ("&&", ";", "||"):
                parts.append(words)
                words = []
            else:
                words.append(token)
        for command in parts + [words]:
            if "pip" in command and "install" in command:
                rest = command[command.index("install") + 1:]
                args, skip = [], False
                for w in rest:
                    if skip:
                        skip = False
                    elif w in ("--index-url", "-i", "--extra-index-url"):
                        skip = True
                    elif not w.startswith("-") or w == "-e":
                        args.append(w)
                out.append(args)
    return out


def makefile_install_commands(*make_args: str) -> tuple[list[str], dict[str, str]]:
    """The commands ``make install`` runs, as make expands them (``make -n -B``: printed,
    not run), and the Makefile's ``?=`` defaults."""
    text = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= ?(.*)$", text, re.M))
    done = subprocess.run(["make", "-n", "-B", "install", *make_args], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()], variables


def test_buildkit_parses_it_and_hadolint_passes(instructions):
    assert [i.cmd for i in instructions][:4] == ["ARG", "ARG", "ARG", "FROM"]
    lint = subprocess.run([str(Path(sys.executable).with_name("hadolint")), "--no-color",
                           str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_base_image_is_the_pinned_ray_with_cuda_or_cpu(instructions):
    gpu = BASE.match(base_image(instructions))
    assert gpu, base_image(instructions)
    assert gpu["ray"] == pinned_ray_version() == ray.__version__
    assert gpu["variant"].startswith("cu12")                  # a concrete CUDA tag, not -gpu
    cpu = base_image(instructions, VARIANT="cpu")
    assert cpu == f"rayproject/ray:{gpu['ray']}-{gpu['py']}-cpu"
    assert arg_defaults(instructions, {"VARIANT": "cpu"})["TORCH_INDEX_URL"].endswith("/whl/cpu")
    chart = yaml.safe_load((REPO / "helm" / "mmpipe" / "values.yaml").read_text())
    assert chart["head"]["rayVersion"] == gpu["ray"]


def test_install_steps_match_the_makefile_and_readme(instructions):
    make_lines, make_vars = makefile_install_commands()
    make = pip_installs(make_lines)
    runs = [i.value[0] for i in instructions if i.cmd == "RUN"]
    image = pip_installs(runs)
    # the same order: torch (the same pin), then the package from the repository root
    # (the image leaves out the editable flag and the test extra)
    assert make[-2:] == [[make_vars["TORCH"]], ["-e", ".[test]"]], make
    assert image == [["${TORCH}"], ["."]], image
    assert arg_defaults(instructions, {})["TORCH"] == make_vars["TORCH"]
    # the index: TORCH_INDEX_URL in both (the README's CPU-only install); none by default
    cpu = arg_defaults(instructions, {"VARIANT": "cpu"})["TORCH_INDEX_URL"]
    assert "--index-url" not in " ".join(make_lines) and make_vars["TORCH_INDEX_URL"] == ""
    torch_line = next(line for line in makefile_install_commands(f"TORCH_INDEX_URL={cpu}")[0]
                      if make_vars["TORCH"] in line)
    assert shlex.split(torch_line)[-3:] == [make_vars["TORCH"], "--index-url", cpu]
    assert '"${TORCH}" --index-url "${TORCH_INDEX_URL}"' in " ".join(runs)
    # two words in TORCH (the old README's form) stop make with a message saying what to do
    bad = subprocess.run(["make", "-n", "install", f"TORCH=torch==2.13.0 --index-url {cpu}"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "give the index as TORCH_INDEX_URL=URL" in bad.stderr
    env = {k: v for i in instructions if i.cmd == "ENV"
           for k, v in zip(i.value[::2], i.value[1::2], strict=True)}
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_HUB_OFFLINE=1" in (REPO / "Makefile").read_text()
    readme = (REPO / "README.md").read_text()
    assert "docker build --build-arg VARIANT=cpu" in readme
    assert f"rayproject/ray:{pinned_ray_version()}" in readme


def test_runs_as_the_images_non_root_user(instructions):
    users = [i.value[0] for i in instructions if i.cmd == "USER"]
    assert users and users[-1] == "1000:100"                  # `ray`:`users` in the Ray image
    first_user = next(n for n, i in enumerate(instructions) if i.cmd == "USER")
    assert not [i for i in instructions[first_user:] if i.cmd == "RUN" and "sudo" in i.value[0]]
    for ins in instructions:
        if ins.cmd in ("COPY", "ADD"):
            assert "--chown=1000:100" in ins.flags, ins.original


def test_copied_paths_exist_and_are_in_the_build_context(instructions):
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for ins in instructions:
        if ins.cmd != "COPY":
            continue
        for src in ins.value[:-1]:
            assert (REPO / src).exists(), src
            assert not any(fnmatch.fnmatch(src, pat) or src.startswith(pat.rstrip("/") + "/")
                           for pat in ignore), f"{src} is excluded by .dockerignore"
    for heavy in (".venv", "output", "bench", ".git"):
        assert heavy in ignore
