"""nutpie and NumPyro behind adapters that name the releases they support, and refuse others before any sampling."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import test_bad_inputs
from test_bad_inputs import _assert_one_error, _run, _tiny_text, _with

from hbnn.sampling import numpyro_adapter, nutpie_adapter

ROOT = Path(__file__).resolve().parents[1]
workspace = test_bad_inputs.workspace  # the battery's directory of earlier outputs


def _fake(monkeypatch, package: str, version: str) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: version if name == package else real(name))


def test_the_pinned_releases_are_the_supported_ones():
    """requirements.lock and requirements-jax.lock pin releases the adapters accept, and pyproject.toml declares
    the same ranges."""
    nutpie_adapter.check_version()
    numpyro_adapter.check_version()
    pins = (ROOT / "requirements.lock").read_text() + (ROOT / "requirements-jax.lock").read_text()
    assert "nutpie==0.16.8" in pins and "numpyro==0.22.0" in pins
    declared = (ROOT / "pyproject.toml").read_text()
    assert '"nutpie>=0.16.8,<0.16.9"' in declared and '"numpyro>=0.22,<0.23"' in declared


@pytest.mark.parametrize("version", ["0.16.9", "0.17.0", "0.16.7", "1.0.0rc1"])
@pytest.mark.parametrize("stage", ["check_params", "fit_hier"])
def test_a_nutpie_outside_the_supported_range_stops_before_sampling(workspace, capsys, monkeypatch, version, stage):
    _fake(monkeypatch, "nutpie", version)
    before = workspace()
    code, err = _run(stage, Path("params.yaml").read_text(), capsys)
    _assert_one_error(code, err, f"nutpie {version} is installed, but hbnn supports nutpie >=0.16.8,<0.16.9")
    assert workspace() == before


def test_a_numpyro_outside_the_supported_range_stops_before_sampling(workspace, capsys, monkeypatch):
    _fake(monkeypatch, "numpyro", "0.23.1")
    before = workspace()
    code, err = _run("check_params", _with("hier_sampler", "backend", "numpyro"), capsys)
    _assert_one_error(code, err, "numpyro 0.23.1 is installed, but hbnn supports numpyro >=0.22.0,<0.23.0")
    assert workspace() == before
    code, err = _run("check_params", _tiny_text(""), capsys)  # nutpie only: NumPyro is not asked
    assert code == 0, err


def test_dvc_repro_with_another_nutpie_installed_prints_one_error_line(tmp_path):
    """A nutpie release the adapter does not know, as `pip install -U nutpie` would leave it: its metadata first on
    the path. `dvc repro`'s first stage stops with the two versions named, before any data or sampling."""
    fake = tmp_path / "site" / "nutpie-0.17.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: nutpie\nVersion: 0.17.0\n")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "params.yaml").write_text(_with("", "n_groups", 3))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "stages" / "check_params.py")], cwd=tmp_path / "w", env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line[:4].isdigit()]
    assert lines == ["error: nutpie 0.17.0 is installed, but hbnn supports nutpie >=0.16.8,<0.16.9 (it builds nutpie's "
                     "model and reads its raw trace through classes that change between releases); install the pinned "
                     "version (make venv, from requirements.lock)"], done.stderr
    assert not (tmp_path / "w" / "data").exists()

