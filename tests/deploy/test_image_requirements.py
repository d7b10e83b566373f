"""Every requirement pinned for the image resolves on the package index for the image's
platform (manylinux x86_64, glibc 2.35) and Python (cp311): pip's resolver is asked for
each pin of requirements/image-gpu.txt (``pip install --dry-run --no-deps``: it reads
the wheels' metadata files, downloads and installs nothing). An unbuildable pin - a
version the index does not have, or has no wheel of for that platform and Python, such as
a CUDA build on an index that does not carry it - fails here instead of in `docker build`.

The hashes of both locks are checked against the files the index publishes for each pin
(every file pip could choose on the image), and pip itself is run in hash-checking mode on
a few small pins: it downloads them, and refuses one whose locked hash is changed.

These are the tests that talk to a remote host (PyPI); they are skipped, saying so, when the
index cannot be reached. The CPU lock's torch (``+cpu``) lives on PyTorch's CPU index: its
hash is checked against that index when it is reachable, else against the digest lock.py
records from it; its other pins are the GPU lock's."""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "requirements"))
import lock  # requirements/lock.py

CHUNKS = 6


@pytest.fixture(scope="module")
def index_reachable():
    try:
        with urllib.request.urlopen(f"{lock.INDEX}/pip/", timeout=10) as r:
            r.read(1)
    except OSError as e:
        pytest.skip(f"the package index {lock.INDEX} is not reachable ({e}): the image's "
                    "pins were not checked")


@pytest.mark.timeout(600)
def test_every_pinned_image_requirement_resolves_for_the_image_platform(index_reachable):
    pins = lock.pins(REPO / "requirements" / "image-gpu.txt")
    cpu = lock.pins(REPO / "requirements" / "image-cpu.txt")
    assert set(cpu) - set(pins) == set() and cpu["torch"] == f"{pins['torch']}+cpu"
    requirements = [f"{name}=={version}" for name, version in sorted(pins.items())]
    chunks = [requirements[i::CHUNKS] for i in range(CHUNKS)]     # pip reads one at a time
    found: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(CHUNKS) as pool:
        for chunk, result in zip(chunks, pool.map(resolve_or_error, chunks)):
            if isinstance(result, str):
                pytest.fail(f"a pin of {chunk} does not resolve for cp311 {lock.PLATFORM}:\n"
                            f"{result}")
            found.update(result)
    assert found == pins


def resolve_or_error(requirements: list[str]) -> dict[str, str] | str:
    """``lock.resolve(requirements, no_deps=True)``, or pip's error message."""
    try:
        return lock.resolve(requirements, no_deps=True)
    except subprocess.CalledProcessError as e:
        return e.stderr[-3000:]


def test_a_pin_the_index_does_not_carry_fails(index_reachable):
    """The check is not vacuous: torch 2.13.0 built for CUDA 12.8 is not on the index."""
    error = resolve_or_error(["torch==2.13.0+cu128"])
    assert isinstance(error, str) and "torch==2.13.0+cu128" in error


def test_every_locked_hash_is_the_index_file_of_that_pin(index_reachable):
    """Each pin's ``--hash`` lines are exactly the sha256 of the files of it the index
    lists for cp311 manylinux x86_64 (a stale or hand-edited hash fails here, not in the
    image build)."""
    gpu = lock.entries(REPO / "requirements" / "image-gpu.txt")
    cpu = lock.entries(REPO / "requirements" / "image-cpu.txt")
    pins = {name: version for name, (version, _) in gpu.items()}
    found = lock.hashes({**pins, "torch+cpu": cpu["torch"][0]})
    assert found.pop("torch+cpu") == cpu["torch"][1]
    assert {name: hashes for name, (_, hashes) in gpu.items()} == found


SMALL = ["six", "idna", "mdurl", "annotated-types"]


def pip_download(requirements, dest, *args: str, python: str = lock.PYTHON,
                 option: str = "-r") -> subprocess.CompletedProcess:
    """``pip download --no-deps`` of a requirements file (``option``: ``-r``, or ``-c`` for
    constraints) for the image's platform and ``python``; ``args`` before the file."""
    cmd = [sys.executable, "-m", "pip", "--isolated", "download", *args,
           "--no-deps", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", *[a for p in lock.PLATFORMS for a in ("--platform", p)],
           "--index-url", lock.INDEX, "-d", str(dest), option, str(requirements)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True,
                          env=lock.pip_env(), timeout=300)


@pytest.mark.timeout(300)
def test_pip_installs_the_locked_files_and_refuses_others(index_reachable, tmp_path):
    gpu = lock.entries(REPO / "requirements" / "image-gpu.txt")
    pins = {name: gpu[name][0] for name in SMALL}
    hashes = {name: gpu[name][1] for name in SMALL}
    good = tmp_path / "good.txt"
    good.write_text(lock.lock_text("gpu", pins, hashes))
    done = pip_download(good, tmp_path / "good", "--require-hashes")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "good").glob("*.whl"))) == len(SMALL)

    tampered = tmp_path / "tampered.txt"
    tampered.write_text(lock.lock_text("gpu", pins, {**hashes, "idna": ["0" * 64]}))
    done = pip_download(tampered, tmp_path / "tampered", "--require-hashes")
    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr and re.search(r"idna", done.stderr)


@pytest.mark.timeout(300)
def test_a_laptop_constrains_with_the_hash_free_pins(index_reachable, tmp_path):
    """Another Python (3.12) takes another wheel of a pin: as a constraint the hashed lock
    refuses it (pip checks a constraint's hashes), requirements/constraints.txt does not."""
    hashed = pip_download(REPO / "requirements" / "image-gpu.txt", tmp_path / "a", "pyyaml",
                          python="3.12", option="-c")
    assert hashed.returncode != 0 and "DO NOT MATCH THE HASHES" in hashed.stderr
    free = pip_download(REPO / "requirements" / "constraints.txt", tmp_path / "b", "pyyaml",
                        python="3.12", option="-c")
    assert free.returncode == 0, free.stderr[-3000:]
    (wheel,) = (tmp_path / "b").glob("*.whl")
    version = lock.pins(REPO / "requirements" / "constraints.txt")["pyyaml"]
    assert wheel.name.startswith(f"pyyaml-{version}-cp312-")
