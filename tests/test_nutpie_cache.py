"""The nutpie compile cache can never fail a fit (issue 10): refusals, corrupt entries, internal errors."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from hbnn.sampling import nutpie_adapter as nutpie_cache

nutpie = pytest.importorskip("nutpie")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(nutpie_cache, "cache_dir", lambda: tmp_path)
    return tmp_path


def _model(constant_size: int = 3) -> pm.Model:
    """A 3-parameter model whose log density reads a constant array of ``constant_size`` floats."""
    const = np.random.default_rng(0).normal(size=constant_size)
    with pm.Model() as model:
        x = pm.Normal("x", shape=3)
        pm.Potential("fit", -1e-6 * pt.sum((x[0] - pt.as_tensor(const)) ** 2))
    return model


def _draws(compiled) -> np.ndarray:
    return nutpie.sample(compiled, draws=10, tune=10, chains=1, seed=3, progress_bar=False).posterior["x"].values


def test_a_wrapper_numba_refuses_to_cache_still_compiles(empty_cache, caplog):
    # 200,000 floats (1.6 MB) are linked as a "dynamic global", which numba will not cache;
    # its refusal used to crash on the custom locator (AttributeError: '_py_file').
    with caplog.at_level("DEBUG", logger="hbnn.sampling.nutpie_adapter"):
        compiled = nutpie_cache.compile_numba(_model(200_000))
    assert np.isfinite(_draws(compiled)).all()
    assert "dynamic globals" in caplog.text
    assert "\x1b[" not in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_corrupt_cache_entry_is_recompiled(empty_cache, caplog):
    reference = _draws(nutpie_cache.compile_numba(_model()))
    entries = list(empty_cache.glob("*.nb[ic]"))
    assert entries
    for path in entries:
        path.write_bytes(b"not a numba cache entry")
    with caplog.at_level("WARNING", logger="hbnn.sampling.nutpie_adapter"):
        compiled = nutpie_cache.compile_numba(_model())
    assert compiled.compiled_logp_func.cache_hits == 0
    np.testing.assert_array_equal(_draws(compiled), reference)


def test_an_error_inside_the_cache_falls_back_to_an_uncached_compile(empty_cache, monkeypatch, caplog):
    def broken(py_func):
        raise RuntimeError("simulated cache failure")

    monkeypatch.setattr(nutpie_cache, "wrapper_key", broken)
    with caplog.at_level("WARNING", logger="hbnn.sampling.nutpie_adapter"):
        compiled = nutpie_cache.compile_numba(_model())
    assert np.isfinite(_draws(compiled)).all()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "simulated cache failure" in warnings[0].getMessage()
    assert not list(empty_cache.glob("*.nb[ic]"))
