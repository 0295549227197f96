"""Mean-field ADVI over the hand-written density (hbnn.sampling.density_advi): the fit ADVI runs where the model has
one, full batch or (the hierarchical fit) in minibatches."""

from __future__ import annotations

import numpy as np
import pytest

from hbnn.config import AdviParams, SamplerParams
from hbnn.density import densities
from hbnn.model.builders import (
    build_flat_model,
    build_hierarchical_minibatch_model,
    build_hierarchical_model,
    build_informed_model,
)
from hbnn.model.network import layer_specs
from hbnn.sampling.advi import AdviBackend
from hbnn.sampling.density_advi import MINIBATCH_STREAM, DensityAdvi, _Minibatch
from hbnn.sampling.nutpie_backend import NutpieBackend
from hbnn.sampling.sampler import Sampler


def _settings(backend="advi", iterations=400, learning_rate=0.02, minibatch_size=0, chains=2, draws=20, advi_starts=1,
              **more):
    return SamplerParams(backend=backend, chains=chains, draws=draws, tune=30, cores=1, **more,
                         advi=AdviParams(iterations=iterations, learning_rate=learning_rate,
                                         minibatch_size=minibatch_size, starts=advi_starts))


def _rows(n=24, groups=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(groups, n, 2))
    y = (X[..., 0] + 0.5 * X[..., 1] + 0.5 * rng.normal(size=(groups, n)) > 0).astype(float).ravel()
    return X, y


def _model(which: str, hidden=(3,), bias=True, minibatch_size=None):
    """PyMC's builder and the hand-written density of a tiny hierarchical, flat or informed model."""
    features = ["x1", "x2"]
    if which == "hierarchical":
        X, y = _rows(n=8, groups=3)
        counts, valid, groups = np.full(3, 8), np.ones((3, 8), dtype=bool), ["a", "b", "c"]

        def build():
            return build_hierarchical_model(X, y, valid, groups, features, hidden, bias=bias)

        return build, densities.HierarchicalDensity(X, y, counts, hidden, bias, "bernoulli", 1.0,
                                                    features=tuple(features), groups=tuple(groups))
    X, y = _rows()
    if which == "flat":
        def build():
            return build_flat_model(X[0], y, features, hidden, 1.0, bias=bias, minibatch_size=minibatch_size)

        return build, densities.FlatDensity.on_rows(X[0], y, hidden, bias, "bernoulli", 1.0, prior_sd=1.0,
                                                    features=tuple(features))
    rng = np.random.default_rng(4)
    prior = {}
    for s in layer_specs(2, hidden, bias):
        a = rng.normal(size=(s.size, s.size))
        prior[s.name] = (rng.normal(size=s.size), a @ a.T / s.size + 0.1 * np.eye(s.size))

    def build():
        return build_informed_model(X[0], y, features, hidden, prior, bias=bias)

    return build, densities.InformedDensity.on_rows(X[0], y, hidden, bias, "bernoulli", 1.0, prior=prior,
                                                    features=tuple(features))


def test_the_same_seed_gives_the_same_trace_and_loss():
    build, density = _model("hierarchical")
    sampler = Sampler(build, _settings(), density)
    assert isinstance(sampler.backend.density_advi, DensityAdvi)
    first, again, other = (sampler.sample(seed, watch=False) for seed in (5, 5, 6))
    np.testing.assert_array_equal(first.loss, again.loss)
    for name in first.posterior.posterior.data_vars:
        np.testing.assert_array_equal(first.posterior.posterior[name].values, again.posterior.posterior[name].values)
    assert not np.array_equal(first.loss, other.loss)
    assert first.loss[-100:].mean() < first.loss[:20].mean() - 10  # the ELBO improved
    assert first.posterior.sample_stats["loss"].dims == ("advi_iteration",)
    assert not first.posterior.sample_stats["diverging"].values.any()
    assert first.posterior.sample_stats["diverging"].shape == (2, 20)


def test_a_per_group_fit_on_other_rows_is_the_fit_of_a_density_built_on_them():
    build, density = _model("flat")
    x, y = _rows(n=15, seed=9)
    sampler = Sampler(build, _settings(iterations=200), density)
    refit = sampler.sample(4, {"x": x[0], "y": y}, watch=False)
    own = Sampler(lambda: build_flat_model(x[0], y, ["x1", "x2"], (3,), 1.0, bias=True), _settings(iterations=200),
                  density.with_rows(x[0], y))
    assert own.backend.density_advi is not None  # checked against PyMC's model of those rows
    own = own.sample(4, watch=False)
    first = sampler.sample(4, watch=False)
    np.testing.assert_array_equal(refit.loss, own.loss)
    np.testing.assert_array_equal(refit.posterior.posterior["w_out"].values, own.posterior.posterior["w_out"].values)
    assert not np.array_equal(refit.loss, first.loss)
    with pytest.raises(ValueError, match="takes new rows as x and y"):
        sampler.sample(4, {"X": x[0], "y": y}, watch=False)


@pytest.mark.parametrize("which", ["hierarchical", "flat", "informed"])
def test_the_trace_has_nutpies_variables_dims_and_coords(which):
    """The draws become exactly the posterior variables, dims and coordinates of nutpie's trace of the density."""
    build, density = _model(which)
    advi = AdviBackend(build, _settings(iterations=50), density)
    assert advi.density_advi is not None
    ours, loss, _ = advi.run(1, None)
    theirs, _, _ = NutpieBackend(build, _settings(backend="nutpie", draws=20), density).run(1, None)
    a, b = ours.posterior, theirs.posterior
    assert list(a.data_vars) == list(b.data_vars)
    for name in b.data_vars:
        assert (a[name].dims, a[name].shape, a[name].dtype) == (b[name].dims, b[name].shape, b[name].dtype), name
    assert set(a.coords) == set(b.coords)
    for dim in b.coords:
        assert list(a[dim].values) == list(b[dim].values), dim
    assert a.attrs == b.attrs
    assert loss.shape == (50,) and np.isfinite(loss).all()
    # a derived variable is the value variables' function, as nutpie's expand computes it
    if which == "hierarchical":
        want = a["mu_out"].values[:, :, None] + a["sd_out"].values[:, :, None, None] * a["z_out"].values
        np.testing.assert_allclose(a["w_out"].values, want, rtol=1e-12)
        np.testing.assert_allclose(a["sd_out"].values, np.exp(a["sd_out_log__"].values), rtol=1e-12)


def _predict(posterior, X):
    """Mean predicted probability of a linear model's draws at rows ``X``."""
    w = posterior["w_out"].values.reshape(-1, 3)  # (draw, 2 features + bias)
    logits = w[:, :2] @ X.T + w[:, 2:]
    return (1.0 / (1.0 + np.exp(-logits))).mean(axis=0)


def test_the_fit_approaches_nuts_on_a_small_model():
    """On logistic regression (near-Gaussian posterior) the fitted means and the predictions
    are close to NUTS's; the loss's level is PyMC's ADVI's on the same model (the same definition)."""
    build, density = _model("flat", hidden=())
    settings = _settings(iterations=4000, learning_rate=0.02, draws=1000)
    advi = Sampler(build, settings, density)
    assert advi.backend.density_advi is not None
    fit = advi.sample(2, watch=False)
    nuts = Sampler(build, _settings(backend="nutpie", draws=1000), density).sample(2, watch=False)
    a, b = fit.posterior.posterior["w_out"].values, nuts.posterior.posterior["w_out"].values
    mean_a, mean_b, sd_b = a.mean(axis=(0, 1)), b.mean(axis=(0, 1)), b.std(axis=(0, 1))
    # one Monte Carlo draw per Adam step leaves the means wandering by about a third of an sd (PyMC's ADVI too)
    assert np.all(np.abs(mean_a - mean_b) < 0.3 * sd_b), (mean_a, mean_b, sd_b)
    assert np.all((0.7 < a.std(axis=(0, 1)) / sd_b) & (a.std(axis=(0, 1)) / sd_b < 1.3))
    grid = np.random.default_rng(3).normal(size=(50, 2))
    assert np.abs(_predict(fit.posterior.posterior, grid) - _predict(nuts.posterior.posterior, grid)).max() < 0.06
    pytensor = Sampler(build, settings).sample(2, watch=False)  # no density: PyMC's ADVI of the same model
    assert fit.loss[-1000:].mean() == pytest.approx(pytensor.loss[-1000:].mean(), abs=0.15)


def test_a_non_finite_loss_names_the_learning_rate():
    build, density = _model("flat")
    sampler = Sampler(build, _settings(learning_rate=1e9, iterations=200), density)
    message = r"ADVI loss became \S+ at iteration \d+; lower sampler\.advi\.learning_rate \(now 1000000000\.0\)"
    with pytest.raises(FloatingPointError, match=message):
        sampler.sample(0, watch=False)


def test_minibatch_fits_with_nothing_to_check_against_and_models_without_a_density_stay_on_pytensor():
    build, density = _model("flat", minibatch_size=8)
    mini = AdviBackend(build, _settings(minibatch_size=8), density)  # no full-batch model to check the density by
    assert mini.density_advi is None and mini.advi is not None
    build, _ = _model("flat")
    plain = AdviBackend(build, _settings(), None)
    assert plain.density_advi is None and plain.advi is not None


def test_several_starts_keep_the_fit_with_the_lowest_final_loss():
    """advi.starts: each start is the fit of its own seed (the first the fit's seed itself), and the one kept has the
    lowest mean loss over its last quarter of steps."""
    from hbnn.sampling.advi_common import keep_best, start_seed

    build, density = _model("hierarchical")
    one = Sampler(build, _settings(), density)
    singles = [one.sample(start_seed(5, i), watch=False) for i in range(3)]
    finals = [s.loss[-100:].mean() for s in singles]
    assert len(set(finals)) == 3 and start_seed(5, 0) == 5
    three = Sampler(build, _settings(advi_starts=3), density).sample(5, watch=False)
    best = int(np.argmin(finals))
    np.testing.assert_array_equal(three.loss, singles[best].loss)
    for name in three.posterior.posterior.data_vars:
        np.testing.assert_array_equal(three.posterior.posterior[name].values,
                                      singles[best].posterior.posterior[name].values)
    fits = {5: ("a", np.array([5.0, 1.0, 1.0, 1.0])), start_seed(5, 1): ("b", np.array([0.0, 3.0, 3.0, 2.0])),
            start_seed(5, 2): ("c", np.array([9.0, 9.0, 9.0, 1.0]))}
    assert keep_best(fits.__getitem__, 5, 3)[0] == "a"  # the last quarter only; ties: the first
    assert keep_best(fits.__getitem__, 5, 1)[0] == "a"


def test_a_start_whose_loss_is_not_finite_is_named_with_its_seed():
    from hbnn.sampling.advi_common import keep_best, start_seed

    def fit(seed):
        if seed != 7:
            raise FloatingPointError("ADVI loss became nan at iteration 3")
        return "ok", np.ones(4)

    with pytest.raises(FloatingPointError, match=rf"iteration 3 \(start 2 of 2, seed {start_seed(7, 1)}\)$"):
        keep_best(fit, 7, 2)
    with pytest.raises(FloatingPointError, match=r"iteration 3$"):
        keep_best(fit, 8, 1)


def _density_on(which: str, likelihood: str, seed: int = 0):
    """A density of ``which`` kind with ``likelihood``, on ragged groups (hierarchical) or one group."""
    rng = np.random.default_rng(seed)
    groups = 5 if which == "hierarchical" else 1
    counts = rng.integers(3, 12, groups) if which == "hierarchical" else np.array([17])
    X = rng.normal(size=(groups, int(counts.max()), 2))
    X[np.arange(X.shape[1])[None, :] >= counts[:, None]] = 0.0
    n = int(counts.sum())
    y = {"bernoulli": rng.integers(0, 2, n), "poisson": rng.poisson(3.0, n), "gaussian": rng.normal(size=n),
         "negative_binomial": rng.poisson(3.0, n)}
    args = (X, y[likelihood].astype(float), counts, (3,), True, likelihood, 1.0)
    if which == "hierarchical":
        return densities.HierarchicalDensity(*args)
    if which == "flat":
        return densities.FlatDensity(*args, prior_sd=1.5)
    prior = {}
    for s in layer_specs(2, (3,), True):
        a = rng.normal(size=(s.size, s.size))
        prior[s.name] = (rng.normal(size=s.size), a @ a.T / s.size + 0.1 * np.eye(s.size))
    return densities.InformedDensity(*args, prior=prior)


@pytest.mark.parametrize("likelihood", ["bernoulli", "poisson", "gaussian", "negative_binomial"])
@pytest.mark.parametrize("which", ["hierarchical", "flat", "informed"])
def test_a_minibatch_is_the_priors_plus_its_rows_likelihood_scaled_to_every_row(which, likelihood):
    """The density at a step's minibatch equals, value and gradient, the prior plus ``n_rows / size`` times the
    likelihood of the rows drawn: a density built on those rows (its groups' rows in the order drawn) less the
    same density with no rows, whose value and gradient are the priors' alone (with every normalising constant)."""
    import dataclasses

    density = _density_on(which, likelihood)
    full = density.pack(density.offsets())
    logp_grad = density.logp_grad()
    n_dim = int(full[10])
    size = 40  # rows drawn from 17 to 35: several land in one group, past a vector of rows (R grows past 8)
    batch = _Minibatch(density, full, size)
    rng = np.random.default_rng(1)
    group = np.repeat(np.arange(density.counts.size), density.counts)
    first = np.concatenate([[0], np.cumsum(density.counts)])
    for _ in range(3):
        rows = rng.integers(0, batch.n_rows, size)
        batch.fill(rows)
        theta = rng.normal(size=n_dim) * 0.4
        got_grad = np.empty(n_dim)
        got = logp_grad(theta, got_grad, batch.buf)
        drawn = [rows[group[rows] == g] for g in range(density.counts.size)]
        counts = np.array([r.size for r in drawn])
        X = np.zeros((counts.size, max(1, counts.max()), 2))
        for g, r in enumerate(drawn):
            X[g, :r.size] = density.X_padded[g, r - first[g]]
        on_rows = dataclasses.replace(density, X_padded=X, y=density.y[np.concatenate(drawn)], counts=counts)
        no_rows = dataclasses.replace(density, X_padded=np.zeros_like(X), y=np.zeros(0), counts=0 * counts)
        values = []
        for d in (on_rows, no_rows):
            grad = np.empty(n_dim)
            values.append((logp_grad(theta, grad, d.pack(d.offsets())), grad))
        (lik_rows, grad_rows), (priors, grad_priors) = values
        scale = batch.n_rows / size
        assert got == pytest.approx(priors + scale * (lik_rows - priors), rel=1e-6)
        np.testing.assert_allclose(got_grad, grad_priors + scale * (grad_rows - grad_priors), rtol=1e-5,
                                   atol=1e-5 * np.abs(got_grad).max())
        assert int(batch.buf[3]) >= counts.max() and int(batch.buf[3]) % int(batch.buf[14]) == 0


def _hierarchical_minibatch(batch: int):
    """PyMC's minibatch and full-batch builders of a small hierarchical model, and its hand-written density."""
    X, y = _rows(n=30, groups=4, seed=3)
    groups, features = ["a", "b", "c", "d"], ["x1", "x2"]
    group = np.repeat(np.arange(4), 30)

    def full():
        return build_hierarchical_model(X, y, np.ones((4, 30), dtype=bool), groups, features, (3,), bias=True)

    def mini():
        return build_hierarchical_minibatch_model(X.reshape(-1, 2), group, y, groups, features, (3,), batch, bias=True)

    density = densities.HierarchicalDensity(X, y, np.full(4, 30), (3,), True, "bernoulli", 1.0,
                                            features=tuple(features), groups=tuple(groups))
    return mini, full, density


def test_a_hierarchical_minibatch_fit_fits_the_density_checked_against_the_full_batch_model():
    """With PyMC's full-batch model to check it against, a minibatch fit fits the hand-written density in minibatches
    (the same approximation, rows drawn as PyMC's minibatch model draws them): deterministic per seed, its rows from
    their own stream, and its loss level PyMC's minibatch ADVI's on the same model (the same definition, scaled)."""
    mini, full, density = _hierarchical_minibatch(16)
    settings = _settings(iterations=3000, learning_rate=0.02, minibatch_size=16)
    sampler = Sampler(mini, settings, density, full)
    assert sampler.backend.density_advi is not None and sampler.backend.density_advi.minibatch_size == 16
    fit, again = (sampler.sample(3, watch=False) for _ in range(2))
    np.testing.assert_array_equal(fit.loss, again.loss)
    assert MINIBATCH_STREAM != 0
    whole = Sampler(full, _settings(iterations=3000, learning_rate=0.02), density).sample(3, watch=False)
    assert not np.array_equal(fit.loss, whole.loss)
    pytensor = Sampler(mini, settings).sample(3, watch=False)  # no density: PyMC's minibatch ADVI
    ours, theirs = fit.loss[-1000:], pytensor.loss[-1000:]
    se = np.sqrt((ours.var() + theirs.var()) / 1000)
    assert abs(ours.mean() - theirs.mean()) < 6 * se + 2.0, (ours.mean(), theirs.mean(), se)
    assert list(fit.posterior.posterior.data_vars) == list(whole.posterior.posterior.data_vars)


def test_a_steps_softplus_holds_float64s_range_and_float32s_precision():
    """A step's exp and log run in float32, and in float64 where rho is past float32's range: sd, sigmoid, log sd and
    the draw match float64's softplus to float32's precision (about |rho| x 6e-8) from rho = -300 to 30."""
    from hbnn.sampling.density_advi import _Step

    rho = np.array([-300.0, -103.0, -85.0, -79.0, -20.0, -5.0, -1e-3, 0.0, 1e-6, 2.0, 30.0])
    mu, eps = np.linspace(-1, 1, rho.size), np.random.default_rng(0).normal(size=rho.size)
    step = _Step(mu.copy(), lambda theta, grad, buf: 0.0, None)
    step.rho[:] = rho
    with np.errstate(all="ignore"):  # as the fit runs its steps: float32's exp underflows past rho = -103
        loss = step(eps, 0.0)
    sd = np.logaddexp(0.0, rho)  # softplus in float64
    bound = 1e-7 * np.maximum(1.0, np.abs(rho))
    assert np.all(np.abs(step.sd / sd - 1.0) <= bound), step.sd / sd - 1.0
    assert np.all(np.abs(step.sig * (1.0 + np.exp(-rho)) - 1.0) <= bound), step.sig
    np.testing.assert_allclose(step.log_sd, np.log(sd), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(step.theta, mu + sd * eps, rtol=1e-12, atol=2e-7)
    assert np.isfinite(loss)
