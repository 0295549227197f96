"""``prior.method``: the plug-in prior (one posterior draw's ``mu`` and ``sd^2 I`` per layer) and ``mvnormal``'s
files and hashes, which the key leaves as they are without it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from hbnn.config import PriorParams
from hbnn.config_read import parse_params
from hbnn.errors import InputError
from hbnn.files import integrity
from hbnn.files.io import provenance, stamp
from hbnn.files.trace import Trace
from hbnn.fitting.prior import derive, recorded
from hbnn.model.network import layer_specs
from hbnn.model.prior import load_prior
from hbnn.pipeline.stages.derive_prior import derive_prior
from hbnn.pipeline.variants import STAGE_PARAMS

SPECS = layer_specs(2, (3,), False)  # in (2, 3), out (3, 1)
CHAINS, DRAWS = 2, 6
TOP = (1, 4)  # the crafted draw of the highest log density


def crafted(seed: int = 0) -> tuple[xr.Dataset, xr.Dataset]:
    """A hierarchical posterior over :data:`SPECS` and its sample stats, whose ``logp`` peaks at :data:`TOP`."""
    rng = np.random.default_rng(seed)
    post = {}
    for s in SPECS:
        post[f"mu_{s.name}"] = (("chain", "draw", *s.dims), rng.normal(size=(CHAINS, DRAWS, *s.shape)))
        post[f"sd_{s.name}"] = (("chain", "draw"), rng.uniform(0.2, 0.6, size=(CHAINS, DRAWS)))
    logp = rng.normal(-50.0, 1.0, size=(CHAINS, DRAWS))
    logp[TOP] = -40.0
    coords = {"chain": range(CHAINS), "draw": range(DRAWS)}
    return xr.Dataset(post, coords=coords), xr.Dataset({"logp": (("chain", "draw"), logp)}, coords=coords)


def plugin(jitter: float = 1e-6) -> PriorParams:
    return PriorParams(method="plugin", jitter=jitter)


def test_plugin_takes_the_top_draws_mu_and_sd_squared():
    posterior, stats = crafted()
    fitted, metrics = derive(plugin(0.01), posterior, SPECS, "tanh", 7, "t.nc", stats)
    for s, (mean, cov) in zip(SPECS, fitted, strict=True):
        sd = float(posterior[f"sd_{s.name}"].values[TOP])
        np.testing.assert_array_equal(mean, posterior[f"mu_{s.name}"].values[TOP].reshape(-1))
        np.testing.assert_array_equal(cov, np.diag(np.full(s.size, sd * sd + 0.01)))
        assert metrics["layers"][s.name]["chosen_sd"] == sd
    assert metrics["method"] == "plugin"
    assert metrics["draws"]["chosen"] == {"chain": TOP[0], "draw": TOP[1], "log_density": -40.0}


def test_plugin_breaks_ties_at_the_lowest_chain_then_draw_and_reads_pymcs_lp():
    posterior, stats = crafted()
    lp = stats["logp"].values.copy()
    lp[1, 1] = lp[0, 5] = lp[1, 0] = 0.0  # three ties above the rest: chain 0 wins, then its draw
    stats = xr.Dataset({"lp": (("chain", "draw"), lp)})  # PyMC's name for it
    _, metrics = derive(plugin(), posterior, SPECS, "tanh", 7, "t.nc", stats)
    assert (metrics["draws"]["chosen"]["chain"], metrics["draws"]["chosen"]["draw"]) == (0, 5)


@pytest.mark.parametrize("stats, message", [
    (None, "has no log density per draw (logp or lp in sample_stats)"),
    (xr.Dataset({"diverging": (("chain", "draw"), np.zeros((CHAINS, DRAWS), bool))}), "an ADVI fit stores none"),
    (xr.Dataset({"logp": (("chain", "draw"), np.zeros((CHAINS, DRAWS - 1)))}), "has (chain, draw) (2, 5)"),
    (xr.Dataset({"logp": (("chain", "draw"), np.full((CHAINS, DRAWS), np.nan))}), "non-finite log densities"),
])
def test_plugin_without_usable_log_densities_is_a_clear_error(stats, message):
    posterior, _ = crafted()
    with pytest.raises(InputError, match="trace t.nc") as err:
        derive(plugin(), posterior, SPECS, "tanh", 7, "t.nc", stats)
    assert message in str(err.value)


def test_mvnormal_ignores_the_stats_and_keeps_its_hashes_and_records():
    posterior, stats = crafted()
    alone = derive(PriorParams(), posterior, SPECS, "tanh", 7, "t.nc")
    with_stats = derive(PriorParams(method="mvnormal"), posterior, SPECS, "tanh", 7, "t.nc", stats)
    for (m1, c1), (m2, c2) in zip(alone[0], with_stats[0], strict=True):
        assert m1.tobytes() == m2.tobytes() and c1.tobytes() == c2.tobytes()
    assert "method" not in alone[1] and alone[1] == with_stats[1]
    # the default's hashes are those of params without the key (the committed default run's files carry them)
    default, named = parse_params({}), parse_params({"prior": {"method": "mvnormal"}})
    detail = Path(__file__).resolve().parents[1] / "metrics" / "detail"
    for stage, name in (("derive_prior", "prior"), ("transfer_prior", "transfer_prior")):
        digest = json.loads((detail / f"{name}.json").read_text())["made_by"]["params_hash"]
        assert default.section_hash(*STAGE_PARAMS[stage]) == named.section_hash(*STAGE_PARAMS[stage]) == digest
    assert parse_params({"prior": {"method": "plugin"}}).section_hash("prior") != default.section_hash("prior")
    assert recorded(default.prior) == {k: v for k, v in dataclasses.asdict(default.prior).items() if k != "method"}
    assert recorded(plugin())["method"] == "plugin"


def test_derive_prior_stage_reads_the_traces_log_densities(tmp_path):
    """The stage reads ``sample_stats`` from the trace file, and the prior file says which method made it."""
    params = parse_params({"prior": {"method": "plugin"}, "hier_sampler": {"chains": CHAINS}})
    posterior, stats = crafted()
    settings = {"hidden_layers": [3], "bias": False, "activation": "tanh", "features": ["x1", "x2"]}
    attrs = provenance("fit_hier", "hierarchical", params.section_hash(*STAGE_PARAMS["fit_hier"]), settings)
    trace = stamp(Trace(posterior=posterior, sample_stats=stats), attrs)
    Trace(**{name: integrity.sealed(trace[name]) for name in trace.groups()}).to_netcdf(tmp_path / "hier.nc")
    metrics = derive_prior(params, tmp_path / "hier.nc", tmp_path / "prior.nc", tmp_path / "prior.json")
    assert metrics["draws"]["chosen"]["chain"] == TOP[0] and metrics["draws"]["chosen"]["draw"] == TOP[1]
    assert json.loads((tmp_path / "prior.json").read_text())["draws"]["chosen"] == metrics["draws"]["chosen"]
    mean, _ = load_prior(tmp_path / "prior.nc", SPECS)["in"]
    with xr.open_dataset(tmp_path / "prior.nc") as ds:
        assert json.loads(ds.attrs["hbnn_settings"])["prior"]["method"] == "plugin"
    np.testing.assert_array_equal(mean, posterior["mu_in"].values[TOP].reshape(-1))


def test_the_report_describes_a_plugin_prior_as_one_draw_not_aligned_draws():
    from hbnn.report.sections import _correlation_section

    plugin = {"method": "plugin", "draws": {"chosen": {"chain": 1, "draw": 7, "log_density": -12.5}}}
    sec = _correlation_section("in", "corr.png", 0, plugin)
    assert "one posterior draw's sd^2 I" in sec.how_to_read and "aligned" not in sec.how_to_read
    assert "chain 1, draw 7 (log density -12.50)" in sec.blocks[-1].text
    fitted = _correlation_section("in", "corr.png", 0, {"alignment": {"chain_1": {"relabelled": 1}}})
    assert "aligned new-group draws" in fitted.how_to_read
    assert "relabelled hidden units of chain_1" in fitted.blocks[-1].text
