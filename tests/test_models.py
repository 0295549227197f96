import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from hbnn.model.builders import build_flat_model, build_hierarchical_model, build_informed_model
from hbnn.model.network import layer_specs, mlp_logit

FEATURES = ["x1", "x2"]
HIDDEN = (5, 4)


def test_layer_specs_names_dims_shapes():
    specs = layer_specs(2, HIDDEN)
    assert [s.var for s in specs] == ["w_in", "w_h1_h2", "w_out"]
    assert [s.dims for s in specs] == [("feature", "hidden_1"), ("hidden_1", "hidden_2"), ("hidden_2",)]
    assert [s.shape for s in specs] == [(2, 5), (5, 4), (4,)]
    assert [s.name for s in layer_specs(3, (6,))] == ["in", "out"]


def test_forward_numpy_matches_pytensor_and_broadcasts():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(7, 2))
    weights = [rng.normal(size=s.shape) for s in layer_specs(2, HIDDEN)]
    ref = np.tanh(np.tanh(X @ weights[0]) @ weights[1]) @ weights[2]
    np.testing.assert_allclose(mlp_logit(X, weights), ref, rtol=1e-12)
    sym = mlp_logit(pt.as_tensor(X), [pt.as_tensor(w) for w in weights], pt.tanh).eval()
    np.testing.assert_allclose(sym, ref, rtol=1e-12)
    # leading (draw,) batch dims broadcast against the rows
    stacked = [np.stack([w, 2 * w]) for w in weights]
    out = mlp_logit(X, stacked)
    assert out.shape == (2, 7)
    np.testing.assert_allclose(out[0], ref, rtol=1e-12)


def test_flat_model_structure(tiny_tasks):
    train = tiny_tasks.split("train")
    rows = train.rows(0)
    model = build_flat_model(train.X[rows], train.y[rows], FEATURES, HIDDEN)
    assert {v.name for v in model.free_RVs} == {"w_in", "w_h1_h2", "w_out"}
    assert model.named_vars_to_dims["w_in"] == ("feature", "hidden_1")
    assert model.named_vars_to_dims["y_obs"] == ("obs",)
    ip = model.initial_point()
    assert ip["w_h1_h2"].shape == (5, 4)
    assert {"x", "y"} <= set(model.named_vars)  # pm.Data that per-group refits replace


def test_hierarchical_model_structure(tiny_tasks):
    pad = tiny_tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tiny_tasks.group_names, FEATURES, HIDDEN)
    free = {v.name for v in model.free_RVs}
    for layer in ("in", "h1_h2", "out"):
        assert {f"mu_{layer}", f"sd_{layer}", f"z_{layer}"} <= free
    assert model.named_vars_to_dims["z_in"] == ("group", "feature", "hidden_1")
    assert model.named_vars_to_dims["w_out"] == ("group", "hidden_2")
    assert model.named_vars_to_dims["mu_h1_h2"] == ("hidden_1", "hidden_2")
    assert model.coords["group"] == tuple(tiny_tasks.group_names)


def test_non_centred_prior_has_intended_moments():
    # w = mu + sd * z with mu ~ N(0,1), sd ~ HalfNormal(1), z ~ N(0,1): E[w]=0, Var[w]=1+E[sd^2]=2.
    X = np.zeros((2, 1, 2))
    model = build_hierarchical_model(X, np.zeros(2), np.arange(2), ["a", "b"], FEATURES, (3,))
    with model:
        prior = pm.sample_prior_predictive(draws=4000, var_names=["w_in", "sd_in"], random_seed=3).prior
    w = prior["w_in"].values.ravel()
    assert abs(w.mean()) < 0.05
    assert w.var() == pytest.approx(2.0, rel=0.07)
    assert prior["sd_in"].values.min() > 0


def _ragged_copy(pad, width, rng):
    """Same data in a wider block layout whose padding is filled with noise."""
    G, old_width, D = pad.X.shape
    X = rng.normal(scale=5.0, size=(G, width, D))
    X[:, :old_width] = np.where(
        (np.arange(old_width)[None, :] < pad.counts[:, None])[..., None], pad.X, X[:, :old_width]
    )
    valid = np.concatenate([g * width + np.arange(c) for g, c in enumerate(pad.counts)])
    return X, valid


def test_padding_rows_never_enter_the_likelihood(ragged_tasks):
    pad = ragged_tasks.padded("train")
    names = ragged_tasks.group_names
    base = build_hierarchical_model(pad.X, pad.y, pad.valid, names, FEATURES, HIDDEN)
    X_wide, valid_wide = _ragged_copy(pad, 20, np.random.default_rng(4))
    wide = build_hierarchical_model(X_wide, pad.y, valid_wide, names, FEATURES, HIDDEN)
    rng = np.random.default_rng(5)
    point = {k: rng.normal(size=np.shape(v)) for k, v in base.initial_point().items()}
    lp_base = base.compile_logp()(point)
    lp_wide = wide.compile_logp()(point)
    assert np.isfinite(lp_base)
    assert lp_wide == pytest.approx(lp_base, rel=1e-12)
    # and the likelihood does see every real row: dropping one changes it
    drop = build_hierarchical_model(pad.X, pad.y[1:], pad.valid[1:], names, FEATURES, HIDDEN)
    assert drop.compile_logp()(point) != pytest.approx(lp_base, rel=1e-9)


def test_informed_model_with_standard_prior_equals_flat(tiny_tasks):
    train = tiny_tasks.split("train")
    rows = train.rows(1)
    specs = layer_specs(2, HIDDEN)
    standard = {s.name: (np.zeros(s.size), np.eye(s.size)) for s in specs}
    informed = build_informed_model(train.X[rows], train.y[rows], FEATURES, HIDDEN, standard)
    flat = build_flat_model(train.X[rows], train.y[rows], FEATURES, HIDDEN)
    rng = np.random.default_rng(6)
    w = {s.name: rng.normal(size=s.shape) for s in specs}
    lp_flat = flat.compile_logp()({f"w_{k}": v for k, v in w.items()})
    lp_inf = informed.compile_logp()({f"z_{k}": v.ravel() for k, v in w.items()})
    assert lp_inf == pytest.approx(lp_flat, rel=1e-12)
    assert informed.named_vars_to_dims["w_in"] == ("feature", "hidden_1")


def test_informed_model_uses_prior_mean_and_covariance():
    specs = layer_specs(2, (3,))
    rng = np.random.default_rng(7)
    prior = {}
    for s in specs:
        a = rng.normal(size=(s.size, s.size))
        prior[s.name] = (rng.normal(size=s.size), a @ a.T + np.eye(s.size))
    model = build_informed_model(np.zeros((1, 2)), np.zeros(1), FEATURES, (3,), prior)
    with model:
        draws = pm.sample_prior_predictive(draws=4000, var_names=["w_in"], random_seed=8).prior["w_in"]
    flat = draws.values.reshape(-1, 6)
    mean, cov = prior["in"]
    np.testing.assert_allclose(flat.mean(0), mean, atol=0.15)
    np.testing.assert_allclose(np.cov(flat, rowvar=False), cov, atol=0.1 * np.abs(cov).max())


def test_likelihood_is_bernoulli_and_its_gradient_stays_finite(tiny_tasks):
    """The log-likelihood equals the Bernoulli log pmf, and huge logits give finite gradients."""
    from scipy.special import expit
    from scipy.stats import bernoulli

    pad = tiny_tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tiny_tasks.group_names, FEATURES, HIDDEN)
    rng = np.random.default_rng(3)
    point = {k: rng.normal(0, 0.5, np.shape(v)) for k, v in model.initial_point().items()}
    loglik = model.logp(vars=[model["y_obs"]])
    outs = [loglik, *model.replace_rvs_by_values([model["w_in"], model["w_h1_h2"], model["w_out"]])]
    lik, *w = model.compile_fn(outs, inputs=model.value_vars, on_unused_input="ignore")(point)
    np.testing.assert_allclose(w[2], point["mu_out"] + np.exp(point["sd_out_log__"]) * point["z_out"])
    logit = mlp_logit(pad.X, w).reshape(-1)[pad.valid]
    expected = bernoulli.logpmf(pad.y, expit(logit)).sum()
    assert lik == pytest.approx(expected, rel=1e-10)

    # Weights far in the tails (sd 30): sigmoid(logit) rounds to 0 or 1 for many rows.
    dlogp = model.compile_dlogp()
    for _ in range(10):
        extreme = {k: rng.normal(0, 30, np.shape(v)) for k, v in model.initial_point().items()}
        assert np.isfinite(dlogp(extreme)).all()


def test_gaussian_padding_rows_never_enter_the_likelihood(ragged_tasks):
    pad = ragged_tasks.padded("train")
    names = ragged_tasks.group_names
    y = np.random.default_rng(10).normal(size=pad.y.size)
    base = build_hierarchical_model(pad.X, y, pad.valid, names, FEATURES, HIDDEN, "gaussian", 0.5)
    X_wide, valid_wide = _ragged_copy(pad, 20, np.random.default_rng(11))
    wide = build_hierarchical_model(X_wide, y, valid_wide, names, FEATURES, HIDDEN, "gaussian", 0.5)
    rng = np.random.default_rng(12)
    point = {k: rng.normal(size=np.shape(v)) for k, v in base.initial_point().items()}
    assert "sigma_log__" in point
    lp_base = base.compile_logp()(point)
    assert np.isfinite(lp_base)
    assert wide.compile_logp()(point) == pytest.approx(lp_base, rel=1e-12)
    drop = build_hierarchical_model(pad.X, y[1:], pad.valid[1:], names, FEATURES, HIDDEN, "gaussian", 0.5)
    assert drop.compile_logp()(point) != pytest.approx(lp_base, rel=1e-9)


def test_gaussian_log_likelihood_is_the_normal_density():
    rng = np.random.default_rng(13)
    X, y = rng.normal(size=(6, 2)), rng.normal(size=6)
    model = build_flat_model(X, y, FEATURES, (), likelihood="gaussian", noise_sd=2.0)
    w, sigma = rng.normal(size=2), 0.7
    point = {"w_out": w, "sigma_log__": np.log(sigma)}
    from scipy.stats import halfnorm, norm

    expected = (norm.logpdf(w).sum() + norm.logpdf(y, X @ w, sigma).sum()
                + halfnorm.logpdf(sigma, scale=2.0) + np.log(sigma))  # + log-Jacobian of the log transform
    assert model.compile_logp()(point) == pytest.approx(expected, rel=1e-10)


def test_zero_hidden_layers_is_a_linear_model(tiny_tasks):
    specs = layer_specs(3, ())
    assert [(s.var, s.dims, s.shape) for s in specs] == [("w_out", ("feature",), (3,))]
    rng = np.random.default_rng(14)
    X, w = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))  # 4 draws
    np.testing.assert_allclose(mlp_logit(X, [w]), w @ X.T, rtol=1e-12)
    pad = tiny_tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tiny_tasks.group_names, FEATURES, ())
    assert {v.name for v in model.free_RVs} == {"mu_out", "sd_out", "z_out"}
    assert model.named_vars_to_dims["w_out"] == ("group", "feature")


def _reference_hierarchical_model(X, y, valid, names, hidden):
    """The hierarchical model as first written: batched ``x @ w`` throughout and ``pm.Bernoulli``."""
    specs = layer_specs(len(FEATURES), hidden)
    with pm.Model() as model:
        weights = []
        for s in specs:
            mu = pm.Normal(f"mu_{s.name}", 0.0, 1.0, shape=s.shape)
            sd = pm.HalfNormal(f"sd_{s.name}", 1.0)
            z = pm.Normal(f"z_{s.name}", 0.0, 1.0, shape=(len(names), *s.shape))
            weights.append(mu + sd * z)
        logit = mlp_logit(pt.as_tensor(X), weights, pt.tanh).reshape((-1,))
        if valid.size != X.shape[0] * X.shape[1]:
            logit = logit[pt.as_tensor(valid)]
        pm.Bernoulli("y_obs", logit_p=logit, observed=y)
    return model


@pytest.mark.parametrize("fixture", ["tiny_tasks", "ragged_tasks"])
def test_hierarchical_log_density_equals_reference_formulation(fixture, request):
    tasks = request.getfixturevalue(fixture)
    pad = tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tasks.group_names, FEATURES, HIDDEN)
    ref = _reference_hierarchical_model(pad.X, pad.y, pad.valid, tasks.group_names, HIDDEN)
    assert [v.name for v in model.value_vars] == [v.name for v in ref.value_vars]
    assert "y_obs" in {v.name for v in model.observed_RVs}
    fns = [(m.compile_logp(mode="FAST_COMPILE"), m.compile_dlogp(mode="FAST_COMPILE")) for m in (model, ref)]
    rng = np.random.default_rng(9)
    for scale in (0.5, 1.0):
        point = {k: rng.normal(scale=scale, size=np.shape(v)) for k, v in model.initial_point().items()}
        (lp, dlp), (lp_ref, dlp_ref) = [(f(point), g(point)) for f, g in fns]
        assert np.isfinite(lp)
        assert lp == pytest.approx(lp_ref, rel=1e-10)
        np.testing.assert_allclose(dlp, dlp_ref, rtol=1e-9, atol=1e-12 * np.abs(dlp_ref).max())
