"""The NumPy cost floor (benchmarks/numpy_floor.py) computes PyMC's own log density and gradient."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from hbnn.model.builders import build_hierarchical_model

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "numpy_floor.py"
_spec = importlib.util.spec_from_file_location("numpy_floor", _PATH)
numpy_floor = importlib.util.module_from_spec(_spec)
sys.modules["numpy_floor"] = numpy_floor  # dataclasses look the module up
_spec.loader.exec_module(numpy_floor)


def _check_against_pymc(pad, names, features, hidden, seed):
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, names, features, hidden)
    floor = numpy_floor.NumpyFloor(pad.X, pad.y, pad.valid, hidden)
    assert [v.name for v in model.value_vars] == floor.names
    logp_fn = model.compile_logp(jacobian=True, mode="FAST_COMPILE")
    dlogp_fn = model.compile_dlogp(jacobian=True, mode="FAST_COMPILE")
    rng = np.random.default_rng(seed)
    for scale in (0.3, 1.0, 2.0):
        theta = rng.normal(scale=scale, size=floor.n_dim)
        point = floor.unravel(theta)
        lp, grad = floor.logp_and_grad(theta)
        np.testing.assert_allclose(lp, logp_fn(point), rtol=1e-8)
        np.testing.assert_allclose(grad, dlogp_fn(point), rtol=1e-8, atol=1e-10 * np.abs(grad).max())


def test_floor_matches_pymc_on_equal_groups(tiny_tasks):
    pad = tiny_tasks.padded("train")
    assert not pad.is_ragged
    _check_against_pymc(pad, tiny_tasks.group_names, tiny_tasks.features, (5, 4), seed=1)


def test_floor_matches_pymc_on_ragged_groups_and_other_depths(ragged_tasks):
    pad = ragged_tasks.padded("train")
    assert pad.is_ragged
    for hidden in ((3,), (4, 3)):
        _check_against_pymc(pad, ragged_tasks.group_names, ragged_tasks.features, hidden, seed=len(hidden))


def test_floor_ignores_padding_values(ragged_tasks):
    pad = ragged_tasks.padded("train")
    noisy = pad.X.copy()
    rows = np.arange(pad.X.shape[1])[None, :] >= pad.counts[:, None]
    noisy[rows] = 7.0
    a = numpy_floor.NumpyFloor(pad.X, pad.y, pad.valid, (4, 3))
    b = numpy_floor.NumpyFloor(noisy, pad.y, pad.valid, (4, 3))
    theta = np.random.default_rng(2).normal(size=a.n_dim)
    lp_a, g_a = a.logp_and_grad(theta)
    lp_b, g_b = b.logp_and_grad(theta)
    assert lp_b == pytest.approx(lp_a, rel=1e-14)
    np.testing.assert_allclose(g_b, g_a, rtol=1e-13, atol=1e-13)


def test_timer_returns_positive_microseconds(tiny_tasks):
    floor = numpy_floor.NumpyFloor.from_tasks(tiny_tasks, (5, 5))
    assert 0 < numpy_floor.us_per_grad(floor, repeats=1, number=5) < 1e6
