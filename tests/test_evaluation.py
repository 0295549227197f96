import numpy as np
import pytest
import xarray as xr

from hbnn.density import numerics
from hbnn.diagnostics import criterion, evaluation, predictions
from hbnn.diagnostics.criterion import function_space_diagnostics
from hbnn.diagnostics.evaluation import reliability
from hbnn.diagnostics.predictions import group_weights, predict_output, predict_proba
from hbnn.model import forward
from hbnn.model.likelihoods import Bernoulli, Gaussian, mixture_cdf, mixture_quantiles
from hbnn.model.network import layer_specs, mlp_logit


def classification_scores(p_bar, y):
    return Bernoulli().scores(Bernoulli().pointwise(p_bar[None, None, :], None, y))


def test_scores_on_hand_computed_example():
    p = np.array([0.9, 0.2, 0.6, 0.4])
    y = np.array([1, 0, 0, 1])
    s = classification_scores(p, y)
    assert s["accuracy"] == 0.5
    assert s["brier"] == pytest.approx((0.01 + 0.04 + 0.36 + 0.36) / 4)
    expected = -np.mean(np.log([0.9, 0.8, 0.4, 0.4]))
    assert s["log_loss"] == pytest.approx(expected)
    assert s["n"] == 4


def test_exactly_half_is_not_class_one():
    assert classification_scores(np.array([0.5]), np.array([1]))["accuracy"] == 0.0


@pytest.mark.parametrize("hidden, bias", [((), False), ((5,), True), ((5, 5), False), ((3, 4, 2), True)])
def test_predict_proba_uses_every_draw_and_matches_numpys_forward_pass(hidden, bias):
    """The compiled float64 pass (hbnn.model.forward) against hbnn.model.network.mlp_logit in NumPy, draw by draw, over
    more rows than one block and weights large enough to reach tanh's tails."""
    rng = np.random.default_rng(0)
    specs = layer_specs(2, hidden, bias)
    weights = [rng.normal(scale=3.0, size=(2, 30, *s.shape)) for s in specs]
    X = rng.normal(size=(forward.BLOCK + 13, 2))
    p = predict_proba(weights, X, "tanh")
    assert p.shape == (2, 30, X.shape[0]) and p.dtype == np.float64
    for c, d in [(0, 0), (1, 4), (1, 29)]:
        logit = mlp_logit(X, [w[c, d] for w in weights])
        np.testing.assert_allclose(predict_output(weights, X, "tanh")[c, d], logit, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(p[c, d], 1 / (1 + np.exp(-logit)), rtol=1e-13, atol=1e-15)


def test_float64_tanh_within_its_stated_error():
    x = np.concatenate([np.linspace(-25, 25, 200_001), [0.0, -0.0, 1e-300, 19.0, 19.5, -40.0]])
    a = x.copy()
    numerics._tanh64_inplace(a, a.size, np.empty_like(a), np.empty(a.size, dtype=np.int64))
    assert np.max(np.abs(a - np.tanh(x))) <= 2.3e-16
    b = -x
    numerics._tanh64_inplace(b, b.size, np.empty_like(b), np.empty(b.size, dtype=np.int64))
    np.testing.assert_array_equal(b, -a)  # odd, exactly


def test_group_weights_selects_group_and_orders_dims():
    specs = layer_specs(2, (3,))
    post = xr.Dataset(
        {
            "w_in": (("group", "chain", "draw", "feature", "hidden_1"), np.arange(48.0).reshape(2, 1, 4, 2, 3)),
            "w_out": (("chain", "draw", "group", "hidden_1"), np.zeros((1, 4, 2, 3))),
        },
        coords={"group": ["a", "b"]},
    )
    w_in, w_out = group_weights(post, specs, "b")
    assert w_in.shape == (1, 4, 2, 3) and w_out.shape == (1, 4, 3)
    assert w_in[0, 0, 0, 0] == 24.0


def test_function_space_diagnostics_detect_disagreeing_chains():
    rng = np.random.default_rng(1)
    good = rng.uniform(0.4, 0.6, size=(2, 500, 5))
    d = function_space_diagnostics(good)
    assert d["max_rhat"] < 1.02
    assert d["min_ess_bulk"] > 300
    bad = good.copy()
    bad[1] += 0.3
    assert function_space_diagnostics(bad)["max_rhat"] > 1.5


def test_reliability_bins_hand_example():
    p = np.array([0.05, 0.15, 0.12, 0.95, 1.0, 0.55])
    y = np.array([0, 1, 0, 1, 1, 0])
    r = reliability(p, y, n_bins=10)
    np.testing.assert_allclose(r["bin_mid"][:2], [0.05, 0.15])
    assert list(r["count"]) == [1, 2, 0, 0, 0, 1, 0, 0, 0, 2]
    assert r["observed"][1] == 0.5 and r["mean_predicted"][1] == pytest.approx(0.135)
    assert np.isnan(r["observed"][2])
    assert r["observed"][9] == 1.0 and r["mean_predicted"][9] == pytest.approx(0.975)


def test_regression_scores_on_hand_computed_example():
    from scipy.stats import norm

    # two draws, three rows; sigma differs between draws
    mu = np.array([[[1.0, 2.0, 0.0], [3.0, 2.0, 0.0]]])  # (chain 1, draw 2, n 3)
    sigma = np.array([[1.0, 2.0]])
    y = np.array([2.0, 2.0, 10.0])
    s = Gaussian().scores(Gaussian().pointwise(mu, sigma, y))
    # posterior-mean predictions 2, 2, 0 -> errors 0, 0, 10
    assert s["rmse"] == pytest.approx(np.sqrt(100 / 3))
    lpd = [np.log(0.5 * norm.pdf(yi, mu[0, 0, i], 1.0) + 0.5 * norm.pdf(yi, mu[0, 1, i], 2.0))
           for i, yi in enumerate(y)]
    assert s["lpd"] == pytest.approx(np.mean(lpd), rel=1e-12)
    # rows 1 and 2 sit near the mixture's centre; row 3 is 5 to 10 sds away
    assert s["coverage_94"] == pytest.approx(2 / 3)
    assert s["n"] == 3


def test_mixture_quantiles_invert_the_mixture_cdf():

    rng = np.random.default_rng(3)
    mu = rng.normal(size=(50, 4)) * 3
    sigma = rng.uniform(0.5, 2.0, size=50)
    q = mixture_quantiles(mu, sigma, (0.03, 0.5, 0.97))
    for k, level in enumerate((0.03, 0.5, 0.97)):
        np.testing.assert_allclose(mixture_cdf(q[k], mu, sigma), level, atol=1e-9)
    # one component: the normal quantile
    single = mixture_quantiles(np.array([[1.0]]), np.array([2.0]), (0.97,))[0, 0]
    assert single == pytest.approx(1.0 + 2.0 * 1.880793608151251, rel=1e-9)


@pytest.mark.parametrize("rhat, ess, divergences, expected", [
    (1.005, 450.0, 0, True),
    (1.011, 450.0, 0, False),  # R-hat over 1.01
    (1.005, 399.0, 0, False),  # bulk ESS under 400
    (1.005, 450.0, 2, True),  # 2 of 2000 draws = 0.1%: at the bar
    (1.005, 450.0, 3, False),
    (None, 450.0, 0, False),  # one chain: no R-hat, no verdict of convergence
    (float("nan"), 450.0, 0, False),
])
def test_the_convergence_bar(rhat, ess, divergences, expected):
    from hbnn.diagnostics.criterion import group_converged

    assert group_converged(rhat, ess, divergences, draws=2000) is expected


def test_fit_metrics_count_groups_not_converged_and_keep_per_group_divergences(ragged_tasks):
    from hbnn.diagnostics.evaluation import fit_metrics

    rng = np.random.default_rng(0)
    split = {s: ragged_tasks.split(s) for s in ("train", "test")}

    def draws(g, s, stuck=False):
        x = rng.uniform(0.2, 0.8, size=(2, 500, split[s].rows(g).size))
        if stuck:
            x[1] += 0.1  # the second chain sits elsewhere: R-hat far above 1.01
        return x

    predictions = {s: {"draws": [draws(g, s, stuck=(g == 1)) for g in range(3)], "noise": None,
                       "y": [split[s].y[split[s].rows(g)] for g in range(3)]} for s in ("train", "test")}
    m = fit_metrics(ragged_tasks, predictions, divergences=5, group_divergences=[0, 0, 5])
    assert [m["per_group"][g]["converged"] for g in ("a", "b", "c")] == [True, False, False]
    assert [m["per_group"][g]["divergences"] for g in ("a", "b", "c")] == [0, 0, 5]
    assert m["sampling"]["groups_not_converged"] == 2
    joint = fit_metrics(ragged_tasks, predictions, divergences=5)  # one joint fit: 5 of 1000 draws concern all
    assert joint["sampling"]["groups_not_converged"] == 3 and "divergences" not in joint["per_group"]["a"]
    assert "sds_not_converged" not in joint["sampling"]  # no group sds: nothing to count
    # a joint fit's group sds are counted beside its groups, and folded into its extremes
    sds = {"sd_in": {"rhat": 1.004, "ess_bulk": 290.0, "ess_tail": 300.0},
           "sd_out": {"rhat": 1.002, "ess_bulk": 1900.0, "ess_tail": 1500.0}}
    joint = fit_metrics(ragged_tasks, predictions, divergences=0, extra_diagnostics=sds)
    assert joint["sampling"]["sds_not_converged"] == 1 and joint["sampling"]["min_ess_bulk"] <= 290.0
    assert "sds_not_converged" in evaluation.headline(joint, "accuracy")["sampling"]


def test_advi_loss_trend_calls_a_curve_still_falling_only_beyond_chance_and_half_a_percent():
    rng = np.random.default_rng(0)
    it = np.arange(4000)
    flat = 40.0 + rng.normal(0.0, 6.0, (1000, it.size))  # levelled off: MC noise only
    trend = criterion.advi_loss_trend(flat)
    assert sum(t["still_falling"] for t in trend) == 0  # 1000 curves, no false alarm at the Bonferroni bar
    falling = 40.0 + 20.0 * np.exp(-it / 3000.0) + rng.normal(0.0, 6.0, it.size)  # still 1.9% down in a quarter
    (one,) = criterion.advi_loss_trend(falling)
    assert one["still_falling"] and one["z"] > 5 and one["drop"] > 0.01
    slight = 4000.0 - 5.0 * it / it.size + rng.normal(0.0, 0.1, it.size)  # certain, but 0.03%: not worth it
    (tiny,) = criterion.advi_loss_trend(slight)
    assert tiny["z"] > 50 and not tiny["still_falling"]
    assert criterion.advi_loss_trend(np.ones(7)) == [{"drop": None, "z": None, "still_falling": False}]


@pytest.mark.parametrize("rhat, ess, falling, expected", [
    (1.03, 450.0, False, True),  # independent draws: R-hat is not judged
    (1.0, 399.0, False, False),  # Monte Carlo precision still is
    (1.0, 900.0, True, False),  # the optimisation has not settled
])
def test_the_advi_bar(rhat, ess, falling, expected):
    assert criterion.group_converged(rhat, ess, 0, 2000, {"still_falling": falling}) is expected


def test_fit_metrics_judge_advi_fits_by_their_loss(ragged_tasks):
    rng = np.random.default_rng(1)
    split = {s: ragged_tasks.split(s) for s in ("train", "test")}
    predictions = {s: {"draws": [rng.uniform(0.2, 0.8, size=(2, 500, split[s].rows(g).size)) for g in range(3)],
                       "noise": None, "y": [split[s].y[split[s].rows(g)] for g in range(3)]}
                   for s in ("train", "test")}
    loss = 40.0 + np.random.default_rng(2).normal(0.0, 6.0, (3, 2000))
    loss[2] += 30.0 * np.exp(-np.arange(2000) / 1000.0)  # group c still falling
    m = evaluation.fit_metrics(ragged_tasks, predictions, divergences=0, group_divergences=[0, 0, 0], advi_loss=loss)
    assert [m["per_group"][g]["converged"] for g in ("a", "b", "c")] == [True, True, False]
    assert m["sampling"]["flagged_groups"] == {}
    assert m["sampling"]["advi_still_falling"] == 1 and m["per_group"]["c"]["advi_loss"]["still_falling"]
    assert evaluation.headline(m, "accuracy")["sampling"]["advi_still_falling"] == 1
    joint = evaluation.fit_metrics(ragged_tasks, predictions, divergences=0, advi_loss=loss[2])  # one joint loss
    assert joint["sampling"]["groups_not_converged"] == 3 and joint["sampling"]["advi_still_falling"] == 1
    nuts = evaluation.fit_metrics(ragged_tasks, predictions, divergences=0, group_divergences=[0, 0, 0])
    assert "advi_still_falling" not in nuts["sampling"] and "advi_loss" not in nuts["per_group"]["a"]


def test_distinct_chains_needs_well_sampled_chains_that_disagree():
    rng = np.random.default_rng(0)
    mixed = rng.normal(0.5, 0.1, (2, 1000, 3))
    assert criterion.distinct_chains(mixed) is None  # one function, sampled twice
    apart = mixed.copy()
    apart[1] += 0.05  # each chain well sampled, in its own place
    evidence = criterion.distinct_chains(apart)
    assert evidence is not None and evidence["separation_sigma"] > criterion.DISTINCT_SIGMA
    assert set(evidence["chain_means"]) == {"0", "1"}
    # Slow chains (random walks) that happen to sit apart are not evidence: more draws would mix them.
    slow = 0.5 + 0.01 * np.cumsum(rng.normal(size=(2, 1000, 3)), axis=1)
    slow[1] += 0.05
    assert criterion.distinct_chains(slow) is None
    assert criterion.distinct_chains(apart[:1]) is None  # one chain: nothing to compare


def _iid_posterior(tasks, specs, rng, chains=2, draws=600):
    """Independent normal draws of every group's weights and of one group sd: a posterior that mixes."""
    groups = tasks.group_names
    data = {s.var: (("chain", "draw", "group", *s.dims), rng.normal(size=(chains, draws, len(groups), *s.shape)))
            for s in specs}
    data["sd_out"] = (("chain", "draw"), np.abs(rng.normal(size=(chains, draws))))
    return xr.Dataset(data, coords={"group": groups})


def test_convergence_shortfall_names_what_misses_the_bar_and_is_silent_when_nothing_does(tiny_tasks):
    specs = layer_specs(tiny_tasks.n_features, (2,))
    post = _iid_posterior(tiny_tasks, specs, np.random.default_rng(0))
    assert criterion.convergence_shortfall(tiny_tasks, post, specs, "tanh", ["sd_out"]) is None
    stuck = post.copy(deep=True)
    name = tiny_tasks.group_names[1]
    stuck["w_out"].loc[{"group": name, "chain": 1}] = stuck["w_out"].sel(group=name, chain=1) + 5.0  # chains apart
    stuck["sd_out"][:] = np.repeat(np.abs(np.random.default_rng(1).normal(size=(2, 30))), 20, axis=1)  # sticky
    short = criterion.convergence_shortfall(tiny_tasks, stuck, specs, "tanh", ["sd_out"])
    message = str(short)
    assert message.startswith("2 quantities miss R-hat <= 1.01 and bulk ESS >= 400")
    assert f"{name} (test-point R-hat" in message and "sd_out (R-hat" in message
    # the smallest ESS of what misses, listed first (worst first): what the run-length control extrapolates from
    assert 0 < short.min_ess < 400 and message.split(": ", 1)[1].split(")")[0].endswith(f"bulk ESS {short.min_ess:.0f}")
    assert criterion.convergence_shortfall(tiny_tasks, stuck, specs, "tanh") is not None  # the group alone misses


def test_shortfall_check_computes_new_draws_only_and_says_what_the_whole_computation_says(tiny_tasks, monkeypatch):
    specs = layer_specs(tiny_tasks.n_features, (2,))
    post = _iid_posterior(tiny_tasks, specs, np.random.default_rng(0))
    name = tiny_tasks.group_names[1]
    post["w_out"].loc[{"group": name, "chain": 1}] = post["w_out"].sel(group=name, chain=1) + 0.3  # short at first
    computed = []
    real = predictions._test_draws
    monkeypatch.setattr(criterion, "_test_draws",
                        lambda t, p, s, a: computed.append(p.sizes["draw"]) or real(t, p, s, a))
    check = criterion.ShortfallCheck(tiny_tasks, specs, "tanh", ["sd_out"])
    for n in (200, 350, 600):  # ever longer prefixes of the same chains, as a fit drawn until the bar looks
        head = post.isel(draw=slice(0, n))
        got, want = check(head), criterion.convergence_shortfall(tiny_tasks, head, specs, "tanh", ["sd_out"])
        assert (got is None) == (want is None) and str(got) == str(want)
    assert computed[0::2] == [200, 150, 250]  # the check's own calls: the new draws only
    other = _iid_posterior(tiny_tasks, specs, np.random.default_rng(5))  # another run: computed whole
    computed.clear()
    assert str(check(other)) == str(criterion.convergence_shortfall(tiny_tasks, other, specs, "tanh", ["sd_out"]))
    assert computed[0] == 600


def test_shortfall_check_evaluates_the_groups_near_the_bar_until_they_meet_it_then_every_group(tiny_tasks,
                                                                                             monkeypatch):
    specs = layer_specs(tiny_tasks.n_features, (2,))
    post = _iid_posterior(tiny_tasks, specs, np.random.default_rng(0), draws=2000)
    names = tiny_tasks.group_names  # three groups
    slow, late = names[1], names[2]
    # the slow group's chains sit apart for their first 100 draws; the late group's chain 1 moves off after 1000
    post["w_out"].loc[{"group": slow, "chain": 1, "draw": slice(0, 99)}] += 3.0
    post["w_out"].loc[{"group": late, "chain": 1, "draw": slice(1000, None)}] += 3.0
    evaluated = []
    real = criterion.function_space_diagnostics
    monkeypatch.setattr(criterion, "function_space_diagnostics", lambda d: evaluated.append(d.shape) or real(d))
    check = criterion.ShortfallCheck(tiny_tasks, specs, "tanh", ["sd_out"])
    looks = {}
    for n in (700, 1000, 1500, 2000):
        evaluated.clear()
        got = check(post.isel(draw=slice(0, n)))
        counted = len(evaluated)
        want = criterion.convergence_shortfall(tiny_tasks, post.isel(draw=slice(0, n)), specs, "tanh", ["sd_out"])
        looks[n] = (str(got), str(want), counted)
    # the first look evaluates every group: the slow one misses, the others are well past the bar
    assert looks[700][0] == looks[700][1] and slow in looks[700][0] and looks[700][2] == len(names)
    assert looks[1000][0] == looks[1000][1] and slow in looks[1000][0] and looks[1000][2] == 1  # it alone
    # it meets the bar at 1500, so every group is evaluated again, and the late group is found
    assert looks[1500][0] == looks[1500][1] and late in looks[1500][0] and slow not in looks[1500][0]
    assert looks[1500][2] == len(names)  # the slow group once, then the two others
    # from then on the late group alone (the slow one met the bar with the margin to spare)
    assert looks[2000][0] == looks[2000][1] and late in looks[2000][0] and looks[2000][2] == 1
    # another run's draws (chains started again): every group again
    evaluated.clear()
    other = _iid_posterior(tiny_tasks, specs, np.random.default_rng(5), draws=700)
    assert check(other) is None and len(evaluated) == len(names)
