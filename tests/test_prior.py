import numpy as np
import pytest

from hbnn.model.alignment import Symmetry, align_to_reference, apply_symmetry, match_symmetry, min_cost_assignment
from hbnn.model.network import layer_specs, mlp_logit
from hbnn.model.prior import (
    ZIGGURAT_R,
    fit_mvnormal,
    fixed_sum,
    ieee_log,
    new_group_draws,
    normal_tail,
    standard_normal,
)

HIDDEN = (5, 5)


def random_net(rng, hidden=HIDDEN, batch=()):
    return [rng.normal(size=(*batch, *s.shape)) for s in layer_specs(2, hidden)]


def random_symmetry(rng, hidden=HIDDEN):
    return Symmetry(tuple(rng.permutation(h) for h in hidden), tuple(rng.choice([-1.0, 1.0], size=h) for h in hidden))


@pytest.mark.parametrize("hidden", [(5, 5), (3,), (4, 3, 2)])
def test_symmetry_preserves_the_network_function(hidden):
    rng = np.random.default_rng(0)
    net = random_net(rng, hidden, batch=(6,))  # six draws at once
    X = rng.normal(size=(30, 2))
    moved = apply_symmetry(net, random_symmetry(rng, hidden))
    np.testing.assert_allclose(mlp_logit(X, moved), mlp_logit(X, net), rtol=1e-10, atol=1e-12)
    assert not np.allclose(moved[0], net[0])


@pytest.mark.parametrize("seed", range(5))
def test_permuted_sign_flipped_copy_aligns_back_exactly(seed):
    rng = np.random.default_rng(seed)
    net = random_net(rng)
    copy = apply_symmetry(net, random_symmetry(rng))
    back = apply_symmetry(copy, match_symmetry(net, copy))
    for a, b in zip(back, net, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_without_signs_a_permuted_copy_aligns_back_and_no_unit_flips(seed):
    """relu's matching: permutations only. A permuted copy aligns back exactly, and a sign-flipped copy (not the
    same function for relu) is never answered with a flip, however well one would fit."""
    rng = np.random.default_rng(seed)
    net = random_net(rng)
    perms = Symmetry(tuple(rng.permutation(h) for h in HIDDEN), tuple(np.ones(h) for h in HIDDEN))
    copy = apply_symmetry(net, perms)
    back = apply_symmetry(copy, match_symmetry(net, copy, signs=False))
    for a, b in zip(back, net, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    flipped = apply_symmetry(net, random_symmetry(rng))
    for sign in match_symmetry(net, flipped, signs=False).sign:
        np.testing.assert_array_equal(sign, 1.0)
    assert any((s < 0).any() for s in match_symmetry(net, flipped).sign)


def test_identity_symmetry_changes_nothing():
    rng = np.random.default_rng(8)
    net = random_net(rng)
    ident = Symmetry.identity(HIDDEN)
    assert ident.is_identity
    for a, b in zip(apply_symmetry(net, ident), net, strict=True):
        np.testing.assert_array_equal(a, b)


def test_identity_is_found_for_an_unchanged_net():
    rng = np.random.default_rng(9)
    net = random_net(rng)
    assert match_symmetry(net, net).is_identity


def test_chains_in_equivalent_modes_are_aligned_to_the_reference():
    rng = np.random.default_rng(1)
    centre = random_net(rng)
    draws = 200
    chain0 = [c + 0.05 * rng.normal(size=(draws, *c.shape)) for c in centre]
    chain1 = apply_symmetry([c + 0.05 * rng.normal(size=(draws, *c.shape)) for c in centre], random_symmetry(rng))
    mu = [np.stack([a, b]) for a, b in zip(chain0, chain1, strict=True)]
    result = align_to_reference(mu, reference_chain=0)
    assert result.symmetries[0].is_identity
    assert not result.symmetries[1].is_identity
    assert result.distance_after[1] < 0.2 < result.distance_before[1]
    # aligned chain 1 now sits on chain 0's labelling, draw for draw
    for layer, c in zip(result.mu, centre, strict=True):
        assert np.abs(layer[1].mean(0) - c).max() < 0.05
    # and pooling unaligned chains would have blurred the prior: much larger spread
    pooled_raw = mu[0].reshape(2 * draws, -1)
    pooled_aligned = result.mu[0].reshape(2 * draws, -1)
    assert pooled_raw.var(0).mean() > 10 * pooled_aligned.var(0).mean()


def test_bad_reference_chain_is_rejected():
    mu = [np.zeros((2, 3, *s.shape)) for s in layer_specs(2, HIDDEN)]
    with pytest.raises(ValueError, match="reference_chain=2"):
        align_to_reference(mu, reference_chain=2)


def test_new_group_draws_follow_mu_plus_sd_noise():
    rng = np.random.default_rng(2)
    mu = [np.full((400, 2, 3), 1.5)]
    sd = [np.full(400, 0.5)]
    (draws,) = new_group_draws(mu, sd, draws_per_sample=25, rng=rng)
    assert draws.shape == (400 * 25, 6)
    assert draws.mean() == pytest.approx(1.5, abs=0.01)
    assert draws.std() == pytest.approx(0.5, rel=0.02)


def test_fit_mvnormal_recovers_mean_and_covariance():
    rng = np.random.default_rng(3)
    cov = np.array([[1.0, 0.8], [0.8, 2.0]])
    samples = rng.multivariate_normal([1.0, -2.0], cov, size=20000)
    mean, est = fit_mvnormal(samples, jitter=1e-6)
    np.testing.assert_allclose(mean, [1.0, -2.0], atol=0.03)
    np.testing.assert_allclose(est, cov, atol=0.05)
    np.linalg.cholesky(est)  # positive definite


def test_fit_mvnormal_is_np_cov_to_rounding():
    samples = np.random.default_rng(4).normal(size=(3001, 7)) * np.arange(1, 8) + 5.0
    mean, cov = fit_mvnormal(samples, jitter=0.25)
    np.testing.assert_allclose(mean, samples.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(cov, np.cov(samples, rowvar=False) + 0.25 * np.eye(7), rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(cov, cov.T)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 1025])
def test_fixed_sum_is_an_accurate_sum_that_memory_layout_does_not_change(n):
    import math

    x = np.random.default_rng(n).normal(size=(n, 3)) * 10.0 ** np.arange(3)
    got = fixed_sum(x)
    exact = np.array([math.fsum(x[:, j]) for j in range(3)])
    assert np.all(np.abs(got - exact) <= 1e-15 * (1 + np.abs(x).sum(axis=0)))
    np.testing.assert_array_equal(fixed_sum(np.asfortranarray(x)), got)
    np.testing.assert_array_equal(fixed_sum(np.ascontiguousarray(x.T), axis=-1), got)


def test_ieee_log_is_log_within_two_ulp():
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.random(100_000), 1.0 - rng.random(1000), np.exp(rng.uniform(-700, 700, 10_000)),
                        [5e-324, 2.0**-1022, 0.5, 1.0, 2.0, np.nextafter(1.0, 2.0), 1.7976931348623157e308]])
    got, want = ieee_log(x), np.log(x)
    assert (got[want == 0] == 0).all()
    assert np.all(np.abs(got - want) <= 2 * np.spacing(np.abs(want)))


def test_normal_tail_is_the_normal_beyond_the_ziggurat_point():
    from scipy import stats

    draws = normal_tail(50_000, np.random.default_rng(7))
    assert draws.min() >= ZIGGURAT_R
    assert stats.kstest(draws, stats.truncnorm(ZIGGURAT_R, np.inf).cdf).pvalue > 0.01


def test_standard_normal_is_numpys_but_beyond_the_tail_point():
    """Draws inside the ziggurat's tail point are NumPy's, bit for bit; those beyond it (about 1 in 3,800) are
    redrawn without libm, with their signs; the shapes and the draws of later arrays stay NumPy's too."""
    shapes = [(400, 10, 25), (400, 10, 5)]
    got = standard_normal(shapes, np.random.default_rng(8))
    raw_rng = np.random.default_rng(8)
    raw = [raw_rng.standard_normal(shape) for shape in shapes]
    tails = 0
    for g, r in zip(got, raw, strict=True):
        inside = np.abs(r) <= ZIGGURAT_R
        np.testing.assert_array_equal(g[inside], r[inside])
        assert (np.abs(g[~inside]) > ZIGGURAT_R).all() and (np.sign(g) == np.sign(r)).all()
        assert (g[~inside] != r[~inside]).all()
        tails += (~inside).sum()
    assert 10 < tails < 60  # 120,000 draws, ~31 expected beyond the point


def test_min_cost_assignment_is_scipys_linear_sum_assignment():
    """The Hungarian algorithm written here (match_symmetry's, so that derive_prior does not import
    scipy.optimize): SciPy's permutation wherever the optimum is unique, SciPy's optimal total wherever costs tie."""
    from scipy.optimize import linear_sum_assignment

    rng = np.random.default_rng(7)
    for trial in range(600):
        n = int(rng.integers(1, 13))
        ties = trial % 3 == 0
        cost = rng.integers(0, 4, size=(n, n)).astype(float) if ties else rng.normal(size=(n, n)) ** 2 * 10.0
        rows, cols = linear_sum_assignment(cost)
        want = cols[np.argsort(rows)]
        got = min_cost_assignment(cost)
        assert sorted(got.tolist()) == list(range(n))
        assert cost[np.arange(n), got].sum() == pytest.approx(cost[np.arange(n), want].sum(), abs=1e-9)
        if not ties:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cost", [[[1.0, np.nan], [2.0, np.nan]], [[1.0, np.inf], [2.0, 3.0]], [[1.0, 2.0]]])
def test_min_cost_assignment_refuses_what_scipy_refuses(cost):
    """A NaN or infinite cost (a trace with non-finite draws) or a non-square matrix is an error, not a search
    that never ends."""
    with pytest.raises(ValueError, match="cost matrix"):
        min_cost_assignment(np.array(cost))
