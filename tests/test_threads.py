"""The hierarchical density's gradient split over the cores its chains leave (hbnn.density.threads): the same bits."""

from __future__ import annotations

import dataclasses
import logging

import numba
import numpy as np
import pytest
from test_backends import _fit_hier, _params, tasks_path  # noqa: F401 - a fixture
from test_kernel import _data

from hbnn.density import densities, threads, written


def _two_threads():
    if threads.usable(2) < 2:
        pytest.skip("numba runs no thread-safe layer with 2 threads here (one core, or neither TBB nor OpenMP)")


@pytest.mark.parametrize("cores, chains, groups, cpus, want", [
    (2, 2, 18, 2, 1), (4, 2, 18, 16, 2), (16, 2, 18, 16, 8), (2, 1, 18, 2, 2), (3, 2, 18, 16, 1),
    (16, 1, 3, 16, 3), (1, 4, 18, 16, 1), (16, 2, 18, 4, 2)])
def test_each_chain_gets_the_cores_the_chains_leave(cores, chains, groups, cpus, want):
    """cores // chains, never past the groups nor past the CPUs there are (16 cores asked of 4: 2 a chain)."""
    assert threads.per_chain(cores, chains, groups, cpus) == want


@pytest.mark.parametrize("likelihood, hidden, bias, counts, scale", [
    ("bernoulli", (5, 5), False, (7, 3, 12, 5, 9), 1.0),
    ("gaussian", (3,), True, (5, 9, 0, 2), 2.5),  # a minibatch's scale, with a group of none of its rows
])
def test_the_split_gradient_is_the_serial_one_to_the_bit(likelihood, hidden, bias, counts, scale):
    """logp_grad_threads sums the groups in group order on the calling thread, as logp_grad does: the same value
    and gradient whatever the threads, so a chain draws the same."""
    _two_threads()
    X, y, counts, _ = _data(likelihood, counts, n_features=3 if bias else 2, seed=4)
    density = densities.HierarchicalDensity(X, y, counts, hidden, bias, likelihood, 0.7)
    buf = density.pack(density.offsets())
    buf[6] = scale
    serial = density.logp_grad()
    split = written._loaded(*density._network(), likelihood, density.activation, False).logp_grad_threads
    rng = np.random.default_rng(2)
    before = numba.get_num_threads()
    try:
        for spread in (0.5, 2.0):
            theta = rng.normal(0.0, spread, int(buf[10]))
            want_grad = np.full(theta.size, np.nan)
            want = serial(theta, want_grad, buf)
            for n, blocks in ((1, 1), (2, 2), (2, 3), (1, len(counts))):
                numba.set_num_threads(n)
                grad = np.full(theta.size, np.nan)
                got = split(theta, grad, buf, blocks)
                assert np.float64(got).tobytes() == np.float64(want).tobytes()
                assert grad.tobytes() == want_grad.tobytes()
    finally:
        numba.set_num_threads(before)


def test_a_hierarchical_fit_draws_the_same_whatever_the_cores_its_gradient_splits_over(tasks_path, tmp_path,  # noqa: F811
                                                                                        caplog, monkeypatch):
    """cores=4 for 2 chains (as if on 4 CPUs): both chains' gradients run on 2 threads each, entering numba's
    threads at once through nutpie's callback, and the fit draws what cores=2 draws, to the bit."""
    _two_threads()
    monkeypatch.setattr("hbnn.density.threads.os.sched_getaffinity", lambda pid: set(range(4)))
    fits = []
    for cores in (2, 4):
        params = _params("nutpie")
        params = dataclasses.replace(params, hier_sampler=dataclasses.replace(params.hier_sampler, cores=cores))
        with caplog.at_level(logging.INFO, logger="hbnn.sampling.nutpie_backend"):
            fits.append(_fit_hier(params, tasks_path, tmp_path / str(cores))[0].posterior)
    assert "splits its 3 groups over 2 threads (cores=4, chains=2)" in caplog.text
    assert list(fits[0].data_vars) == list(fits[1].data_vars)
    for name in fits[0].data_vars:  # the attrs differ: they record the settings, cores among them
        assert fits[0][name].values.tobytes() == fits[1][name].values.tobytes(), name
