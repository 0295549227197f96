"""Every backend writes the same trace layout and metrics keys; ADVI specifics."""

from __future__ import annotations

import dataclasses
import json

import arviz as az
import numpy as np
import pytest
import xarray as xr
from conftest import TINY

from hbnn.config import ConfigError
from hbnn.config_read import parse_params
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.files.io import RUN_TIME_ATTRS, RUN_TIME_STATS
from hbnn.files.outputs import write_netcdf
from hbnn.files.trace import Trace
from hbnn.model.builders import build_flat_model
from hbnn.pipeline.stages.fit_hier import fit_hier
from hbnn.sampling import nutpie_backend, pymc_backends, restarts, runlength
from hbnn.sampling.backend import Iterations, _leapfrog_steps
from hbnn.sampling.sampler import Sampler

ADVI = {"iterations": 300, "learning_rate": 0.02}


def _params(backend: str, **advi):
    sampler = dict(TINY["sampler"], backend=backend, advi={**ADVI, **advi})
    return parse_params(dict(TINY, sampler=sampler, hier_sampler={**TINY["hier_sampler"], **sampler}))


@pytest.fixture(scope="module")
def tasks_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("backends") / "tasks.nc"
    write_netcdf(make_moons_tasks(DataSpec.of(parse_params(TINY))), path)
    return path


def _fit_hier(params, tasks_path, out):
    metrics = fit_hier(params, tasks_path, out / "hier.nc", out / "hier.json", out / "timing.json")
    return az.from_netcdf(out / "hier.nc"), metrics, json.loads((out / "timing.json").read_text())


@pytest.fixture(scope="module")
def reference(tasks_path, tmp_path_factory):
    """The default backend's hierarchical fit, whose layout every backend must match."""
    return _fit_hier(_params("nutpie"), tasks_path, tmp_path_factory.mktemp("nutpie"))


def _layout(idata):
    return {name: (da.dims, da.shape) for name, da in idata.posterior.data_vars.items()}


def _keys(d, prefix=""):
    out = set()
    for k, v in d.items():
        out |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out


@pytest.mark.parametrize("backend, advi", [("pymc", {}), ("numpyro", {}), ("blackjax", {}), ("advi", {}),
                                           ("advi", {"minibatch_size": 16})])
def test_backend_writes_the_same_layout_and_keys(backend, advi, tasks_path, reference, tmp_path):
    idata, metrics, timing = _fit_hier(_params(backend, **advi), tasks_path, tmp_path)
    ref_idata, ref_metrics, ref_timing = reference
    assert _layout(idata) == _layout(ref_idata)
    # ADVI adds how its loss ended (the bar it is judged by) and nothing else
    advi_keys = {k for k in _keys(metrics) if ".advi_loss." in k or k == "sampling.advi_still_falling"}
    assert bool(advi_keys) == (backend == "advi")
    assert _keys(metrics) - advi_keys == _keys(ref_metrics)
    assert timing["backend"] == backend
    assert timing["sampling"]["seconds"] > 0
    assert int(idata.sample_stats["diverging"].sum()) == metrics["sampling"]["divergences"]
    if backend == "pymc":  # tuning steps are counted too
        assert timing["sampling"]["grad_evals"] >= TINY["sampler"]["chains"] * (TINY["sampler"]["tune"] + 25)
    if backend in ("numpyro", "blackjax"):  # the JAX bridge does not report tuning steps
        assert timing["sampling"]["grad_evals"] is None
    if backend in ("pymc", "numpyro", "blackjax"):  # pm.sample compiles inside each call: no separate time
        assert timing["sampling"]["compile_seconds"] is None
    # No wall-clock times in the trace (PyMC's per-draw timers and sampling time): the same params write the same
    # bytes, so DVC does not rerun the stages after it
    for name in idata.groups():
        assert not set(RUN_TIME_STATS) & set(idata[name].data_vars), name
        assert not set(RUN_TIME_ATTRS) & set(idata[name].attrs), name
    if backend == "advi":
        assert idata.sample_stats["loss"].sizes["advi_iteration"] == ADVI["iterations"]
        assert timing["sampling"]["advi_iterations"] == ADVI["iterations"]
        assert metrics["test"]["accuracy"] > 0.6  # it learned something in 300 steps


@pytest.mark.slow
def test_a_pymc_fit_writes_the_same_bytes_twice(tasks_path, tmp_path):
    """PyMC's NUTS, run twice with the same params, writes a byte-identical trace (~20 s)."""
    _fit_hier(_params("pymc"), tasks_path, tmp_path / "a")
    _fit_hier(_params("pymc"), tasks_path, tmp_path / "b")
    assert (tmp_path / "a" / "hier.nc").read_bytes() == (tmp_path / "b" / "hier.nc").read_bytes()


def test_pymc_chains_start_safely_in_a_process_that_ran_jax(tasks_path, tmp_path):
    """PyMC's NUTS forks its chain processes; after JAX has started its threads that fork can
    deadlock (JAX warns, pytest fails on the warning), so the chains start from a forkserver."""
    jnp = pytest.importorskip("jax.numpy")
    assert float(jnp.ones(3).sum()) == 3.0  # starts JAX's runtime and its threads
    assert pymc_backends._chain_process_context() == "forkserver"
    idata, metrics, _ = _fit_hier(_params("pymc"), tasks_path, tmp_path)
    assert idata.posterior.sizes["chain"] == TINY["hier_sampler"]["chains"]


def test_advi_per_group_fits_reuse_one_compile_and_are_independent(tiny_tasks):
    """Refitting a group after others reproduces its first fit exactly: state is reset per fit."""
    train = tiny_tasks.split("train")
    rows = [train.rows(g) for g in range(tiny_tasks.n_groups)]
    model = build_flat_model(train.X[rows[0]], train.y[rows[0]], tiny_tasks.features, (5, 5))
    sampler = Sampler(model, _params("advi").sampler)
    first = sampler.sample(11, data={"x": train.X[rows[0]], "y": train.y[rows[0]]})
    other = sampler.sample(12, data={"x": train.X[rows[1]], "y": train.y[rows[1]]})
    again = sampler.sample(11, data={"x": train.X[rows[0]], "y": train.y[rows[0]]})
    np.testing.assert_array_equal(first.loss, again.loss)
    np.testing.assert_array_equal(first.posterior.posterior["w_in"], again.posterior.posterior["w_in"])
    assert not np.array_equal(first.loss, other.loss)
    assert first.loss[-50:].mean() < first.loss[:50].mean()  # the ELBO improved


def test_minibatch_likelihood_is_unbiased_for_the_full_one(tiny_tasks):
    """Averaged over random batches, the rescaled minibatch log-likelihood equals the full one."""
    train = tiny_tasks.split("train")
    r = train.rows(0)
    full = build_flat_model(train.X[r], train.y[r], tiny_tasks.features, (5, 5))
    mini = build_flat_model(train.X[r], train.y[r], tiny_tasks.features, (5, 5), minibatch_size=4)
    rng = np.random.default_rng(0)
    point = {k: rng.normal(0, 1, np.shape(v)) for k, v in full.initial_point().items()}
    exact = full.compile_fn(full.logp(vars=[full["y_obs"]]), inputs=full.value_vars)(point)
    batch = mini.compile_fn(mini.logp(vars=[mini["y_obs"]]), inputs=mini.value_vars, random_seed=1)
    draws = np.array([batch(point) for _ in range(4000)])
    assert draws.std() > 0  # batches really differ
    # unscaled, the mean would be exact * 4 / 20
    assert draws.mean() == pytest.approx(exact, rel=0.03)


def test_missing_jax_is_a_clear_config_error(tiny_tasks, monkeypatch):
    real = pymc_backends.importlib.util.find_spec
    monkeypatch.setattr(pymc_backends.importlib.util, "find_spec", lambda m: None if m == "numpyro" else real(m))
    train = tiny_tasks.split("train")
    model = build_flat_model(train.X, train.y, tiny_tasks.features, (2,))
    with pytest.raises(ConfigError, match=r"sampler.backend='numpyro'.*make jax"):
        Sampler(model, _params("numpyro").sampler)


@pytest.mark.parametrize("raw, key", [({"backend": "stan"}, "sampler.backend"),
                                      ({"advi": {"iterations": 0}}, "sampler.advi.iterations"),
                                      ({"advi": {"learning_rate": -1}}, "sampler.advi.learning_rate"),
                                      ({"advi": {"minibatch_size": -2}}, "sampler.advi.minibatch_size"),
                                      ({"advi": {"starts": 0}}, "sampler.advi.starts"),
                                      ({"advi": {"bogus": 1}}, "sampler.advi.bogus")])
def test_bad_sampler_settings_name_the_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_params({"sampler": raw})


def test_low_rank_mass_matrix_reaches_nutpie(tiny_tasks):
    """``sampler.mass_matrix: low_rank`` changes nutpie's adaptation, not the trace layout."""
    train = tiny_tasks.split("train")
    rows = train.rows(0)
    model = build_flat_model(train.X[rows], train.y[rows], tiny_tasks.features, (2,))
    fits = {}
    for mass_matrix in ("diag", "low_rank"):
        params = parse_params(dict(TINY, sampler=dict(TINY["sampler"], mass_matrix=mass_matrix)))
        fits[mass_matrix] = Sampler(model, params.sampler).sample(3).posterior
    assert _layout(fits["low_rank"]) == _layout(fits["diag"])
    assert not np.array_equal(fits["low_rank"].posterior["w_in"].values, fits["diag"].posterior["w_in"].values)


def test_numpyro_progress_reaches_the_heartbeat_in_a_log_and_leaves_the_draws_alone(tiny_tasks, monkeypatch):
    """In a log, NumPyro's progress callbacks are counted for the heartbeat; the draws are those of a fit
    without them (the callbacks do not touch the chains' arithmetic)."""
    train = tiny_tasks.split("train")
    model = build_flat_model(train.X, train.y, tiny_tasks.features, (2,))
    # a step size adapted for 40% acceptance diverges now and then: the count below has something to count
    settings = dataclasses.replace(_params("numpyro").sampler, target_accept=0.4)
    monkeypatch.setattr(pymc_backends.logs, "interactive", lambda: False)
    sampler = Sampler(model, settings)
    seen = []
    real = Iterations.add

    def add(self, n):
        real(self, n)
        seen.append((self, self.status()))

    monkeypatch.setattr(Iterations, "add", add)
    counted = sampler.sample(3, watch=False).posterior
    total = settings.chains * (settings.tune + settings.draws)
    assert seen and seen[-1][1].startswith(f"{total}/{total} iterations")
    # every draw after tuning reported whether it diverged, as it happened: the count is the trace's
    assert seen[-1][0].divergences == int(counted.sample_stats["diverging"].sum()) > 0
    assert "divergences so far" in seen[-1][1]
    assert sampler.backend.iterations is None  # nothing left over once the fit is done
    counted = counted.posterior
    plain = pymc_backends.JaxBackend.run(sampler.backend, 3, None, progressbar=False)[0].posterior
    for var in counted.data_vars:
        np.testing.assert_array_equal(counted[var].values, plain[var].values)


def _blocks_fit(tiny_tasks, backend, max_draws, answers, **settings):
    """A ``backend`` fit of 25 draws per chain with ``max_draws`` (and other ``settings``); ``until`` gives
    ``answers`` in turn."""
    train = tiny_tasks.split("train")
    model = build_flat_model(train.X, train.y, tiny_tasks.features, (2,))
    settings = dataclasses.replace(_params(backend).sampler, max_draws=max_draws, **settings)
    seen = []

    def until(posterior):
        seen.append(posterior.sizes["draw"])
        assert posterior["w_in"].dims[:2] == ("chain", "draw")  # model variables, as the trace will hold them
        return answers[len(seen) - 1]

    fit = Sampler(model, settings).sample(3, watch=False, until=until)
    return fit, seen


@pytest.mark.parametrize("backend", ["numpyro", "nutpie"])
def test_fit_goes_on_in_blocks_while_the_draws_miss_the_bar_and_keeps_the_first_block(tiny_tasks, backend):
    fixed, seen = _blocks_fit(tiny_tasks, backend, 0, [])
    assert seen == [] and fixed.posterior.posterior.sizes["draw"] == 25  # max_draws 0: never asked
    fit, seen = _blocks_fit(tiny_tasks, backend, 100, ["g00 misses", None])
    assert seen == [25, 50]  # asked after each block, stopped once nothing missed the bar
    post, stats = fit.posterior.posterior, fit.posterior.sample_stats
    assert post.sizes["draw"] == 50 and stats["diverging"].shape == (2, 50)
    # the first block is the fixed-length run's draws: going on changes nothing already drawn
    np.testing.assert_array_equal(post["w_in"].values[:, :25], fixed.posterior.posterior["w_in"].values)
    assert not np.array_equal(post["w_in"].values[:, 25:], post["w_in"].values[:, :25])
    again, _ = _blocks_fit(tiny_tasks, backend, 100, ["g00 misses", None])
    np.testing.assert_array_equal(again.posterior.posterior["w_in"].values, post["w_in"].values)


@pytest.mark.parametrize("backend", ["numpyro", "nutpie"])
def test_fit_stops_at_max_draws_even_while_the_bar_is_missed(tiny_tasks, backend, caplog):
    fit, seen = _blocks_fit(tiny_tasks, backend, 75, ["g00 misses"] * 5)
    assert seen == [25, 50, 75]  # asked after every block; after 75 no block of 25 fits under max_draws
    assert fit.posterior.posterior.sizes["draw"] == 75
    assert "stopped at max_draws=75 draws per chain, and g00 misses" in caplog.text


def test_nutpie_keeps_the_draws_up_to_the_extrapolated_look_that_meets_the_bar(tiny_tasks, monkeypatch):
    from hbnn.diagnostics.criterion import Shortfall

    monkeypatch.setattr(runlength, "CHECK_UNIT", 1)
    fixed, _ = _blocks_fit(tiny_tasks, "nutpie", 0, [])
    # ESS 390 after 25 draws: 25 x 440 / 390 = 28.2 draws needed, so it looks again at 29 (within 20% of 25 further),
    # and keeps those
    fit, seen = _blocks_fit(tiny_tasks, "nutpie", 100, [Shortfall("g00 misses", 390.0), None])
    assert seen == [25, 29]
    post = fit.posterior.posterior
    assert post.sizes["draw"] == 29 and fit.posterior.sample_stats["diverging"].shape == (2, 29)
    np.testing.assert_array_equal(post["w_in"].values[:, :25], fixed.posterior.posterior["w_in"].values)


def test_nutpie_starts_the_chains_again_from_the_best_chain_where_the_first_look_finds_them_failing(
        tiny_tasks, monkeypatch, caplog):
    judged = []

    def reason(head, missing):
        judged.append((head.posterior.sizes["draw"], missing))
        return ("chain 0 is stuck", 1)

    monkeypatch.setattr(nutpie_backend, "restart_reason", reason)
    fixed, _ = _blocks_fit(tiny_tasks, "nutpie", 100, ["g00 misses", None])
    assert judged == []  # restarts 0: never judged
    fit, seen = _blocks_fit(tiny_tasks, "nutpie", 100, ["g00 misses", "g00 misses", None], restarts=1)
    assert seen == [25, 25, 50] and judged == [(25, "g00 misses")]  # judged at the first look; restarts used up
    assert "restarting the chains from chain 1's draws (restart 1 of at most 1): chain 0 is stuck" in caplog.text
    post, stats = fit.posterior.posterior, fit.posterior.sample_stats
    assert post.sizes["draw"] == 50 and stats["diverging"].shape == (2, 50)
    (record,) = json.loads(stats.attrs["hbnn_restarts"])
    assert record["reason"] == "chain 0 is stuck" and record["restarted_from_chain"] == 1
    assert record["draws_per_chain"] == 25 and [c["chain"] for c in record["chains"]] == [0, 1]
    # the attempt left behind: the fixed fit's first look (same seed), its gradients counted in the fit's
    first = fixed.posterior.sample_stats
    assert record["chains"][1]["mean_log_density"] == pytest.approx(float(first["logp"].values[1, :25].mean()))
    # the record: steps to the first look, warmup included; the fit's count: the attempt's to its cancel too
    assert record["leapfrog_steps"] > int(first["n_steps"].values[:, :25].sum())
    assert fit.grad_evals > record["leapfrog_steps"] + int(stats["n_steps"].values.sum())
    # new chains, from draws of chain 1's second half, and the same ones on every run
    assert not np.array_equal(post["w_in"].values[:, :25], fixed.posterior.posterior["w_in"].values[:, :25])
    again, _ = _blocks_fit(tiny_tasks, "nutpie", 100, ["g00 misses", "g00 misses", None], restarts=1)
    np.testing.assert_array_equal(again.posterior.posterior["w_in"].values, post["w_in"].values)
    assert again.posterior.sample_stats.attrs["hbnn_restarts"] == stats.attrs["hbnn_restarts"]  # whatever the timing


def test_a_fit_that_stops_with_divergences_past_the_bar_and_no_restart_left_says_so(tiny_tasks, monkeypatch, caplog):
    from hbnn.diagnostics import criterion

    _blocks_fit(tiny_tasks, "nutpie", 100, [None])
    assert "no restart left" not in caplog.text  # within the bar: nothing to say
    monkeypatch.setattr(criterion, "divergences_within_bar", lambda total, draws: False)
    fit, seen = _blocks_fit(tiny_tasks, "nutpie", 100, [None])
    assert seen == [25]
    total = int(fit.posterior.sample_stats["diverging"].values.sum())
    said = (f"stopped with {total} divergences in 50 draws, past the bar's 0.1%, and no restart left "
            "(hier_sampler.restarts=0, 0 used): the metrics and the report count every group not converged")
    assert said in caplog.text


def test_nutpie_starts_the_chains_again_where_a_later_look_finds_them_failing(tiny_tasks, monkeypatch, caplog):
    """A chain can drift into a worse region after the first look (on 30 groups one did between 600 and 800 draws
    per chain): every look judges the chains while restarts are left."""
    judged = []

    def reason(head, missing):
        judged.append(head.posterior.sizes["draw"])
        return ("chain 0 drifted", 1) if len(judged) == 2 else None

    monkeypatch.setattr(nutpie_backend, "restart_reason", reason)
    fit, seen = _blocks_fit(tiny_tasks, "nutpie", 100, ["g00 misses"] * 3 + [None], restarts=1)
    assert seen == [25, 50, 25, 50] and judged == [25, 50]  # judged at both looks; after the restart, none left
    assert "restarting the chains from chain 1's draws (restart 1 of at most 1): chain 0 drifted" in caplog.text
    (record,) = json.loads(fit.posterior.sample_stats.attrs["hbnn_restarts"])
    assert record["draws_per_chain"] == 50 and record["restarted_from_chain"] == 1
    assert fit.posterior.posterior.sizes["draw"] == 50


def test_nutpie_counts_the_steps_of_chains_still_running(tiny_tasks):
    """An attempt left behind is counted up to its cancel: its chains run on past the first look."""
    train = tiny_tasks.split("train")
    settings = dataclasses.replace(_params("nutpie").sampler, max_draws=1_000_000)
    backend = nutpie_backend.NutpieBackend(build_flat_model(train.X, train.y, tiny_tasks.features, (2,)), settings)
    backend.until = lambda posterior: "g00 misses"
    run = backend.start(3, None)
    try:
        poll = nutpie_backend._Poll(run.running, run.compiled.coords, backend)
        head = poll.first(settings.draws)
        steps = poll.steps_so_far()
        assert poll.final is None  # still running: counted from nutpie's trace so far
    finally:
        run.running.cancel()
    assert steps >= _leapfrog_steps(head, "warmup_sample_stats", "sample_stats") > 0


def test_nutpie_chains_start_at_the_unconstrained_values_of_a_draw(tiny_tasks):
    from hbnn.density import densities, pymc_check

    pad = tiny_tasks.padded("train")
    density = densities.HierarchicalDensity(pad.X, pad.y, pad.counts, (3,), False, "bernoulli", 1.0,
                                         features=tuple(tiny_tasks.features), groups=tuple(tiny_tasks.group_names))
    compiled = density.nutpie_model()
    names, slices, shapes = compiled.shape_info
    thetas = np.random.default_rng(4).normal(size=(2, 6, compiled.n_dim))  # (chain, draw, unconstrained)
    expanded = np.array([[pymc_check.call_expand(compiled, t) for t in chain] for chain in thetas])
    posterior = xr.Dataset({name: (("chain", "draw", *(f"{name}_{i}" for i in range(len(shape)))),
                                   expanded[:, :, where].reshape(2, 6, *shape))
                            for name, where, shape in zip(names, slices, shapes, strict=True)})
    start = nutpie_backend.starting_from(compiled, posterior, 1).initial_point_func
    points = [start(seed) for seed in range(20)]
    assert any("_log__" in n for n in names)  # the sds' unconstrained values are read, not the sds
    for point in points:  # each a draw of chain 1's second half
        assert any(np.array_equal(point, thetas[1, d]) for d in (3, 4, 5))
    assert np.array_equal(start(7), start(7))


def _first_look(diverging, logp, step_size=(0.01, 0.01)) -> Trace:
    chains, draws = np.shape(logp)
    stats = xr.Dataset({"diverging": (("chain", "draw"), np.asarray(diverging, dtype=bool)),
                        "logp": (("chain", "draw"), np.asarray(logp, dtype=float)),
                        "step_size": (("chain", "draw"), np.repeat(np.asarray(step_size)[:, None], draws, axis=1))})
    return Trace(posterior=xr.Dataset(), sample_stats=stats)


def test_restart_reason_names_divergent_or_stuck_chains_and_the_chain_to_start_from():
    from hbnn.diagnostics.criterion import Shortfall

    rng = np.random.default_rng(0)
    logp = rng.normal(-2155.0, 25.0, (2, 500))
    calm = np.zeros((2, 500), dtype=bool)
    disagree = Shortfall("sd_in misses", 4.0, 1.45, "sd_in")
    slow = Shortfall("g02 misses", 200.0, 1.08, "g02 test-point")
    assert restarts.restart_reason(_first_look(calm, logp), None) is None
    assert restarts.restart_reason(_first_look(calm, logp), disagree) is None  # similar log densities: no verdict
    stuck = logp - np.array([[0.0], [25.0]])
    reason, best = restarts.restart_reason(_first_look(calm, stuck), disagree)
    assert best == 0 and reason.startswith("the chains disagree (sd_in R-hat 1.45 after 500 draws per chain) and "
                                           f"chain 1's mean log density, {stuck[1].mean():.1f}, lies ")
    assert reason.endswith(f"standard errors below chain 0's, {stuck[0].mean():.1f}")
    assert restarts.restart_reason(_first_look(calm, stuck), slow) is None  # R-hat of slow mixing: no verdict
    diverging = calm.copy()
    diverging[0, ::100] = True  # 5 of 1000 draws: a Poisson count at the bar's 0.1% reaches 5 with chance 0.004
    reason, best = restarts.restart_reason(_first_look(diverging, logp, (0.011, 0.0058)), None)
    assert best == 1 and reason.startswith("5 divergences in the first 500 draws per chain (chain 0: 5 at step "
                                           "size 0.011, chain 1: 0 at step size 0.0058), more than the 0.1%")
    diverging[0, 400] = False  # 4: chance 0.019, within what the bar's share gives at a look that goes on
    assert restarts.restart_reason(_first_look(diverging, logp), slow) is None
    # ... but where everything else meets the bar the fit would stop with 4 in 1000, past the bar's 1: every group
    # would count as not converged, and more draws do not dilute a steady rate
    reason, best = restarts.restart_reason(_first_look(diverging, logp), None)
    assert best == 1 and reason == ("4 divergences in the first 500 draws per chain (chain 0: 4 at step size 0.01, "
                                    "chain 1: 0 at step size 0.01), past the bar's 0.1% of draws where everything "
                                    "else meets it")
    within = calm.copy()
    within[1, 9] = True  # 1 in 1000: within the bar
    assert restarts.restart_reason(_first_look(within, logp), None) is None
    # the healthy chain's stray divergence does not make the stuck chain the one to start from
    one = calm.copy()
    one[0, 7] = True
    reason, best = restarts.restart_reason(_first_look(one, stuck), disagree)
    assert best == 0 and "chain 1's mean log density" in reason
    assert restarts.restart_reason(_first_look(calm, stuck), "a plain message") is None  # no R-hat: no verdict


def test_next_check_goes_where_the_smallest_ess_extrapolates_within_a_block(caplog):
    from hbnn.config import SamplerParams
    from hbnn.diagnostics.criterion import Shortfall

    caplog.set_level("INFO", logger=runlength.log.name)
    s = SamplerParams(backend="nutpie", draws=500, max_draws=5000)
    look = runlength._next_check
    assert look(None, 500, s, 100) is None  # nothing misses: stop
    # ESS 388 at 1500: 1500 x 400 x 1.1 / 388 = 1701 draws needed, so look at 1800 (not at 2000)
    assert look(Shortfall("g02 misses", 388.0), 1500, s, 100) == 1800
    assert "after 1500 draws per chain, g02 misses; looking again at 1800" in caplog.text
    # far short: at most 20% of the draws so far further (rounded up to whole steps, at least one), at most a block
    assert look(Shortfall("g02 misses", 100.0), 500, s, 100) == 600
    assert look(Shortfall("g02 misses", 206.0), 600, s, 100) == 800
    assert look(Shortfall("g02 misses", 100.0), 2000, s, 100) == 2400
    assert look(Shortfall("g02 misses", 100.0), 4000, s, 100) == 4500
    assert look(Shortfall("R-hat only", 900.0), 500, s, 100) == 600  # the ESS suffices: one step
    assert look(Shortfall("R-hat only", 900.0), 3000, s, 100) == 3300  # ... or 10% of the draws so far
    assert look(Shortfall("R-hat only", 900.0), 3050, s, 100) == 3450  # (rounded up to whole steps)
    assert look(Shortfall("no ESS", float("nan")), 500, s, 100) == 600  # nothing to extrapolate: the most
    assert look(Shortfall("no ESS", float("nan")), 3000, s, 100) == 3500
    assert look("a plain message", 500, s, 100) == 600
    assert look(Shortfall("g02 misses", 388.0), 1500, s, 500) == 2000  # NumPyro's whole blocks
    assert look(Shortfall("g02 misses", 100.0), 4800, s, 100) == 5000  # never past max_draws
    assert look(Shortfall("g02 misses", 100.0), 5000, s, 100) is None
    assert "stopped at max_draws=5000 draws per chain, and g02 misses" in caplog.text


def test_nutpie_heartbeat_past_the_first_look_says_how_far_the_next_look_is(monkeypatch):
    from hbnn.config import SamplerParams

    backend = object.__new__(nutpie_backend.NutpieBackend)
    backend.settings = SamplerParams(backend="nutpie", draws=500, max_draws=5000)
    assert backend.progress(10.0) is None  # before the first look: the cost estimate speaks
    backend.towards = (1230, 1500, 30.0, 100.0)  # 270 draws to go at 30 per second, seen at t=100
    monkeypatch.setattr(nutpie_backend.time, "monotonic", lambda: 102.0)
    assert backend.progress(60.0) == ("1230/1500 draws per chain at the next look (up to max_draws=5000), "
                                      "~7s to it at this rate")
    backend.towards = (0, 600, None, 100.0)  # no rate yet
    assert backend.progress(60.0) == "0/600 draws per chain at the next look (up to max_draws=5000)"


def test_iterations_status_says_how_far_and_how_long_at_the_rate(monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(nutpie_backend.time, "monotonic", lambda: next(clock))
    it = Iterations()
    assert it.status() is None  # still compiling
    it.total = 8000
    it.add(0)  # first report at t=100
    it.add(2000)
    assert it.status() == "2000/8000 iterations (tuning included), ~30s left at this rate"  # t=110


def test_advi_reports_its_iterations_to_the_heartbeat(tiny_tasks, monkeypatch):
    train = tiny_tasks.split("train")
    model = build_flat_model(train.X, train.y, tiny_tasks.features, (2,))
    sampler = Sampler(model, _params("advi").sampler)
    seen = []
    real = Iterations.add

    def add(self, n):
        real(self, n)
        seen.append(sampler.backend.progress(0.0))

    monkeypatch.setattr(Iterations, "add", add)
    sampler.sample(4, watch=False)
    assert seen[-1].startswith(f"{ADVI['iterations']}/{ADVI['iterations']} ADVI iterations")
    assert sampler.backend.progress(0.0) is None  # nothing once the fit is done


class _Clock:
    """A fake ``time`` for :class:`nutpie_backend._Poll`: ``sleep`` moves ``monotonic`` on and is recorded."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


class _Running:
    """A nutpie run whose two chains make ``rate`` iterations a second, ``tune`` of them tuning, and whose
    ``inspect`` takes ``cost`` seconds (its copy of every draw so far)."""

    def __init__(self, clock, rate, cost, tune):
        self.clock, self.rate, self.cost, self.tune, self.polls = clock, rate, cost, tune, 0
        self.is_finished = False

    def inspect(self):
        import pyarrow

        self.polls += 1
        self.clock.now += self.cost
        rows = int(self.rate * self.clock.now)
        batch = pyarrow.RecordBatch.from_pydict({"tuning": [i < self.tune for i in range(rows)]})
        return type("Raw", (), {"get_arrow_trace": lambda _: ([batch, batch], [batch, batch])})()


@pytest.mark.parametrize("cost", [0.01, 3.0])
def test_polls_are_spaced_by_the_chains_rate_and_by_what_a_poll_costs(monkeypatch, cost):
    """A poll waits for the draws a look needs at the slowest chain's rate, tuning included, never sooner than a
    second nor than POLL_COST_SHARE of its own copy's time allows: a copy that takes 3 s (a large trace) is made
    at most every 150 s, so polling takes at most 2% of the chains' time."""
    clock = _Clock()
    monkeypatch.setattr(nutpie_backend, "time", clock)
    monkeypatch.setattr(nutpie_backend, "trace_from_batches", lambda draws, stats, coords: {
        g: xr.Dataset({"x": (("chain", "draw"), np.zeros((2, 600)))}) for g in
        ("posterior", "sample_stats", "warmup_sample_stats")})
    settings = dataclasses.replace(_params("nutpie").sampler, tune=1000, draws=500)
    backend = type("Backend", (), {"settings": settings, "poll_seconds": nutpie_backend.NutpieBackend.poll_seconds,
                                   "towards": None})()
    running = _Running(clock, rate=5.0, cost=cost, tune=1000)
    head = nutpie_backend._Poll(running, {}, backend).first(500)
    assert head.posterior.sizes["draw"] == 500
    least = max(backend.poll_seconds, cost / nutpie_backend.POLL_COST_SHARE)
    assert all(least <= s <= 10 * least for s in clock.slept)
    assert sum(running.polls * [cost]) <= nutpie_backend.POLL_COST_SHARE * clock.now + cost
    # 1,500 iterations at 5 a second: 300 s, polled every 10 s at most where a copy is cheap; where it costs 3 s,
    # the second poll learns the rate and the third finds the draws there (before: a poll every second)
    assert clock.now >= 300 and running.polls <= (3 if cost > 1 else 300 / 10 + 2)
