"""Steps, datasources and datasinks from the user's own package (``pipeline.plugins``):
the example package ``examples/plugin`` is pip-installed into a temporary ``--target``
directory (the venv is left as it is) and reaches the driver, the worker processes and
the Ray workers through ``PYTHONPATH``; jobs run as a user runs them (``python -m
pipeline``), by entry point name and by import path. The fingerprint follows the
plugin's settings and version; every way a plugin fails to load is exit 2 naming the
spec field and the value."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import cli
from pipeline.media.decode import decode_image
from pipeline.read import committed_files, read_committed
from tests.conftest import CASES, PHOTOS, REPO
from tests.e2e.jobs import clean_ray_env

EXAMPLE = REPO / "examples" / "plugin"
SPEC = EXAMPLE / "plugin.yaml"
GRAY = CASES / "C47_gray" / "hopper_gray.jpg"


def _install(tmp: Path, version: str) -> Path:
    """A copy of the example package at ``version`` in ``tmp/src`` (pip and setuptools
    build in the source folder: the checkout stays clean), installed with ``pip install
    --no-deps --no-build-isolation --target tmp/site``: the package and its
    ``.dist-info`` (entry points, version)."""
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                 "__pycache__"))
    toml = src / "pyproject.toml"
    toml.write_text(toml.read_text().replace('version = "0.1.0"', f'version = "{version}"'))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src)],
                   check=True, capture_output=True, timeout=300)
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example package, version 0.1.0, installed into a temporary directory."""
    return _install(tmp_path_factory.mktemp("plugin"), "0.1.0")


@pytest.fixture(scope="module")
def site_v2(tmp_path_factory) -> Path:
    """The same package with version 0.2.0 (nothing else changed), installed apart."""
    return _install(tmp_path_factory.mktemp("plugin-v2"), "0.2.0")


def _mmpipe(site: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = clean_ray_env(PYTHONPATH=str(site), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def _fingerprint(site: Path, *overrides: str) -> str:
    done = _mmpipe(site, "validate", str(SPEC), *overrides, timeout_s=120)
    assert done.returncode == 0, done.stderr
    return re.search(r"valid \(fingerprint ([0-9a-f]{16})\)", done.stdout).group(1)


def _colorfulness(path: Path) -> float:
    """Hasler-Süsstrunk colourfulness of the photo's decoded pixels, computed here. The
    step sees the decoder's pixels, converted to sRGB from an embedded ICC profile
    (000000062554 has one: Pillow's plain RGB would give 44.0 for its 55.0)."""
    rgb = decode_image(path.read_bytes()).pixels.astype(np.float64)
    rg = rgb[..., 0] - rgb[..., 1]
    yb = (rgb[..., 0] + rgb[..., 1]) / 2 - rgb[..., 2]
    return float(np.sqrt(rg.std() ** 2 + yb.std() ** 2)
                 + 0.3 * np.sqrt(rg.mean() ** 2 + yb.mean() ** 2))


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """Six real photos with their caption sidecars, and one grayscale photo."""
    folder = tmp_path_factory.mktemp("input")
    for jpg in sorted(PHOTOS.glob("*.jpg"))[:6]:
        for f in PHOTOS.glob(jpg.stem + ".*"):
            shutil.copy(f, folder / f.name)
    shutil.copy(GRAY, folder / GRAY.name)
    return folder


def _check_output(out: Path, photos: Path, digits: int) -> None:
    rows = read_committed(str(out), ["key", "status", "caption", "colorfulness"]).to_pylist()
    assert sorted(r["key"] for r in rows) == sorted(p.stem for p in photos.glob("*.jpg"))
    assert [r["status"] for r in rows] == ["ok"] * 7
    for r in rows:
        expected = round(_colorfulness(photos / f"{r['key']}.jpg"), digits)
        assert r["colorfulness"] == pytest.approx(expected, abs=1.5 * 10 ** -digits), r["key"]
    by_key = {r["key"]: r for r in rows}
    assert by_key["hopper_gray"]["colorfulness"] == 0.0
    assert min(r["colorfulness"] for k, r in by_key.items() if k != "hopper_gray") > 5
    # the plugin datasink's files are committed like the Parquet files
    files = committed_files(str(out), "jsonl")
    assert len(files) == len(list((out / "_checkpoints").glob("p-*.json"))) >= 2
    lines = [json.loads(line) for f in files for line in Path(f).read_text().splitlines()]
    lines.sort(key=lambda r: r["key"])
    assert [(r["key"], r["caption"]) for r in lines] == [
        (k, by_key[k]["caption"]) for k in sorted(by_key)]
    assert [r["colorfulness"] for r in lines] == pytest.approx(     # float32 in the Parquet
        [by_key[k]["colorfulness"] for k in sorted(by_key)], abs=1e-4)


def test_the_example_runs_in_worker_processes_by_entry_point_names(site, site_v2, photos,
                                                                   tmp_path):
    out = tmp_path / "out"
    done = _mmpipe(site, "run", str(SPEC), "--executor", "processes", "--input", str(photos),
                   "--output", str(out), "--set", "source.partition_size=3",
                   "--set", "resize.mode=none")    # no draft decode: full-size pixels
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows: ok=7 rejected=0 error=0" in done.stdout
    _check_output(out, photos, digits=2)
    # a rerun with another version of the plugin is another fingerprint: refused
    v2 = _mmpipe(site_v2, "run", str(SPEC), "--executor", "processes",
                 "--input", str(photos), "--output", str(out), "--set",
                 "source.partition_size=3", "--set", "resize.mode=none")
    assert v2.returncode == 2 and "fingerprint" in v2.stderr, v2.stderr[-2000:]


def test_the_example_runs_on_ray_by_import_paths(site, photos, tmp_path):
    out = tmp_path / "out"
    done = _mmpipe(site, "run", str(SPEC), "--executor", "ray", "--address", "local",
                   "--input", str(photos), "--output", str(out),
                   "--set", "source.partition_size=4", "--set", "resize.mode=none",
                   "--set", "steps=[{uses: 'mmpipe_plugin_example:ColorfulnessStep', "
                   "with: {digits: 3}}]",
                   "--set", "sink.datasinks=[{uses: mmpipe_plugin_example.JsonlDatasink, "
                   "with: {columns: [key, caption, colorfulness]}}]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows: ok=7 rejected=0 error=0" in done.stdout
    _check_output(out, photos, digits=3)


def test_the_fingerprint_follows_the_plugins_settings_and_version(site, site_v2):
    by_name = _fingerprint(site)
    by_path = _fingerprint(site, "--set", "steps=[{uses: mmpipe_plugin_example.ColorfulnessStep"
                                          ", with: {digits: 2}}]",
                           "--set", "sink.datasinks=[{uses: 'mmpipe_plugin_example:"
                                    "JsonlDatasink', with: {columns: [key, caption, "
                                    "colorfulness]}}]")
    assert by_path == by_name                     # the same classes, the same settings
    assert _fingerprint(site, "--set", "steps=[{uses: colorfulness, with: {digits: 3}}]") \
        != by_name
    assert _fingerprint(site_v2) != by_name       # only the version differs
    explained = _mmpipe(site_v2, "validate", "--explain", str(SPEC)).stdout
    assert ("steps[0]: mmpipe_plugin_example.colorfulness:ColorfulnessStep "
            "(mmpipe-plugin-example 0.2.0)") in explained


# --- a plugin that cannot be loaded is a spec error (exit 2) naming field and value ----

def _spec(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "source": {"kind": "files", "uri": str(PHOTOS)}, "sink": {"uri": str(tmp_path / "o")},
        "text_embedding": {"enabled": False}, **extra}))
    return path


BROKEN = "import sys\nraise RuntimeError('this plugin needs a GPU driver')\n"


@pytest.mark.parametrize("extra, message", [
    ({"steps": [{"uses": "no_such_package_xyz:MyStep"}]},
     "steps[0].uses: 'no_such_package_xyz:MyStep': cannot import module "
     "'no_such_package_xyz': ModuleNotFoundError"),
    ({"steps": [{"uses": "tests.assembly.mean_brightness_step:NoSuchStep"}]},
     "steps[0].uses: 'tests.assembly.mean_brightness_step:NoSuchStep': "
     "'tests.assembly.mean_brightness_step' has no attribute 'NoSuchStep'"),
    ({"steps": [{"uses": "broken_plugin_xyz.Step"}]},
     "steps[0].uses: 'broken_plugin_xyz.Step': cannot import module 'broken_plugin_xyz': "
     "RuntimeError: this plugin needs a GPU driver"),
    ({"steps": [{"uses": "no-such-step"}]},
     "steps[0].uses: 'no-such-step' is no entry point of group 'mmpipe.steps'"),
    ({"steps": [{"uses": "tests.assembly.mean_brightness_step:MeanBrightnessStep"},
                {"uses": "tests.output.keys_datasink:KeysDatasink"}]},
     "steps[1].uses: 'tests.output.keys_datasink:KeysDatasink' is <class "
     "'tests.output.keys_datasink.KeysDatasink'>, not a subclass of pipeline.steps.base.Step"),
    ({"steps": [{"uses": "tests.assembly.mean_brightness_step.MeanBrightnessStep",
                 "with": {"digitz": 3}}]},
     "steps[0].with: tests.assembly.mean_brightness_step:MeanBrightnessStep refused its "
     "settings {'digitz': 3}: TypeError"),
    ({"sink": {"uri": "OUT", "datasinks": [{"uses": "tests.assembly.mean_brightness_step:"
                                                    "MeanBrightnessStep"}]}},
     "sink.datasinks[0].uses: 'tests.assembly.mean_brightness_step:MeanBrightnessStep' is "
     "<class 'tests.assembly.mean_brightness_step.MeanBrightnessStep'>, not a subclass of "
     "pipeline.output.sinks.base.FileDatasink"),
    ({"source": {"kind": "plugin", "uri": str(PHOTOS), "uses": "no-such-source"}},
     "source.uses: 'no-such-source' is no entry point of group 'mmpipe.datasources'"),
    ({"steps": [{"uses": "my step"}]},
     "steps.0.uses: Value error, 'my step' is not 'module:Class', 'module.Class' or an "
     "entry point name"),
])
def test_a_plugin_that_cannot_be_loaded_is_a_spec_error(extra, message, tmp_path, monkeypatch,
                                                        capsys):
    (tmp_path / "broken_plugin_xyz.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    if "sink" in extra:
        extra["sink"]["uri"] = str(tmp_path / "o")
    spec = _spec(tmp_path, **extra)
    assert cli.main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "o").exists()


def test_a_plugin_step_reading_what_nothing_writes_is_refused_naming_the_plugin(tmp_path,
                                                                               capsys):
    spec = _spec(tmp_path, source={"kind": "files", "media": "video",
                                   "uri": str(REPO / "data/videos")},
                 steps=[{"uses": "tests.assembly.mean_brightness_step:MeanBrightnessStep"}])
    assert cli.main(["validate", str(spec)]) == 2
    assert ("MeanBrightnessStep (steps[0]: tests.assembly.mean_brightness_step:"
            "MeanBrightnessStep) reads '_pixels', which no earlier part writes"
            ) in capsys.readouterr().err
