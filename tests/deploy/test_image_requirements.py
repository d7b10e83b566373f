"""Every requirement pinned for the image resolves on the package index for the image's
platform (manylinux x86_64, glibc 2.35) and Python (cp311): pip's resolver is asked for
each pin of requirements/image-gpu.txt (``pip install --dry-run --no-deps``: it reads
the wheels' metadata files, downloads and installs nothing). An unbuildable pin - a
version the index does not have, or has no wheel of for that platform and Python, such as
a CUDA build on an index that does not carry it - fails here instead of in `docker build`.

This is the one test that talks to a remote host (PyPI); it is skipped, saying so, when the
index cannot be reached. The CPU lock's torch (``+cpu``) lives on PyTorch's CPU index,
which is not checked here; its other pins are the GPU lock's."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "requirements"))
import lock  # noqa: E402  (requirements/lock.py)

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
