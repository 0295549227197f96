"""`hbnn predict` on small synthetic traces whose predictions can be computed by hand."""

from __future__ import annotations

import subprocess
import sys

import arviz as az
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy.special import expit

from hbnn import cli
from hbnn.files.io import InputError, provenance, stamp
from hbnn.files.outputs import write_netcdf
from hbnn.model import likelihoods
from hbnn.model.likelihoods import mixture_cdf
from hbnn.pipeline.predict import predict_table

FEATURES = ["a", "b"]
GROUPS = ["g1", "g2"]
X_MEAN, X_SD = np.array([10.0, -1.0]), np.array([2.0, 0.5])
Y_MEAN, Y_SD = 100.0, 20.0
CHAINS, DRAWS = 2, 30


def write_trace(path, variant, likelihood="bernoulli", group_sd=0.3, seed=0):
    """A linear-model trace (no hidden layers) with random weights and the stats above."""
    rng = np.random.default_rng(seed)
    post = {"w_out": (("chain", "draw", "group", "feature"), rng.normal(size=(CHAINS, DRAWS, 2, 2)))}
    if variant == "hierarchical":
        post["mu_out"] = (("chain", "draw", "feature"), rng.normal(size=(CHAINS, DRAWS, 2)))
        post["sd_out"] = (("chain", "draw"), np.full((CHAINS, DRAWS), group_sd))
    extra = likelihoods.get(likelihood).extra
    if extra:  # gaussian's sigma, negative_binomial's alpha
        dims = ("chain", "draw") if variant == "hierarchical" else ("chain", "draw", "group")
        post[extra] = (dims, rng.uniform(0.2, 0.5, size=(CHAINS, DRAWS, 2)[: len(dims)]))
    posterior = xr.Dataset(post, coords={"chain": range(CHAINS), "draw": range(DRAWS), "group": GROUPS,
                                         "feature": FEATURES})
    constant = xr.Dataset({"x_mean": ("feature", X_MEAN), "x_sd": ("feature", X_SD), "y_mean": ((), Y_MEAN),
                           "y_sd": ((), Y_SD)}, coords={"feature": FEATURES})
    idata = az.InferenceData(posterior=posterior, constant_data=constant)
    settings = {"hidden_layers": [], "features": FEATURES, "likelihood": likelihood, "group_column": "shop"}
    stamp(idata, provenance("fit", variant, "test", settings))
    write_netcdf(idata, path)
    return posterior


NEW = pd.DataFrame({"shop": ["g2", "g2", "new", "g1"], "a": [12.0, 8.0, 10.0, 11.0], "b": [-1.0, 0.0, -2.0, -0.5],
                    "note": ["x", "y", "z", "w"]})


def standardised():
    return (NEW[FEATURES].to_numpy() - X_MEAN) / X_SD


def test_known_groups_use_their_own_posterior(tmp_path):
    post = write_trace(tmp_path / "t.nc", "flat")
    known = NEW[NEW["shop"] != "new"].reset_index(drop=True)
    out = predict_table(tmp_path / "t.nc", known, "input")
    X = (known[FEATURES].to_numpy() - X_MEAN) / X_SD
    for i, g in enumerate(known["shop"]):
        w = post["w_out"].sel(group=g).values.reshape(-1, 2)
        p = expit(w @ X[i])
        assert out.loc[i, "mean"] == pytest.approx(p.mean(), abs=1e-6)
        assert out.loc[i, "sd"] == pytest.approx(p.std(), abs=1e-6)
        assert out.loc[i, "lower_94"] == pytest.approx(np.quantile(p, 0.03), abs=1e-6)
        assert out.loc[i, "upper_94"] == pytest.approx(np.quantile(p, 0.97), abs=1e-6)
    assert list(out.columns) == [*known.columns, "mean", "sd", "lower_94", "upper_94", "unseen_group"]
    assert not out["unseen_group"].any()


def test_unseen_group_uses_the_population_of_the_hierarchical_model(tmp_path):
    post = write_trace(tmp_path / "t.nc", "hierarchical", group_sd=0.0)
    out = predict_table(tmp_path / "t.nc", NEW, "input")
    X = standardised()
    mu = post["mu_out"].values.reshape(-1, 2)
    # with a group sd of 0 a new group's weights are exactly the group mean
    assert out.loc[2, "mean"] == pytest.approx(expit(mu @ X[2]).mean(), abs=1e-6)
    assert list(out["unseen_group"]) == [False, False, True, False]
    w = post["w_out"].sel(group="g2").values.reshape(-1, 2)
    assert out.loc[0, "mean"] == pytest.approx(expit(w @ X[0]).mean(), abs=1e-6)


def test_population_draws_are_seeded_and_spread_with_the_group_sd(tmp_path):
    write_trace(tmp_path / "t.nc", "hierarchical", group_sd=2.0)
    a = predict_table(tmp_path / "t.nc", NEW, "input", seed=0)
    b = predict_table(tmp_path / "t.nc", NEW, "input", seed=0)
    c = predict_table(tmp_path / "t.nc", NEW, "input", seed=1)
    pd.testing.assert_frame_equal(a, b)
    assert a.loc[2, "mean"] != c.loc[2, "mean"]
    assert a.loc[0, "mean"] == c.loc[0, "mean"]  # known groups do not use the seed
    write_trace(tmp_path / "narrow.nc", "hierarchical", group_sd=0.0)
    assert predict_table(tmp_path / "narrow.nc", NEW, "input").loc[2, "sd"] < a.loc[2, "sd"]


@pytest.mark.parametrize("variant", ["flat", "informed"])
def test_unseen_group_on_flat_or_informed_trace_is_an_error(tmp_path, variant):
    write_trace(tmp_path / "t.nc", variant)
    with pytest.raises(InputError, match=r"groups \['new'\] that the .* model was not fit to"):
        predict_table(tmp_path / "t.nc", NEW, "input")


def test_gaussian_predictions_include_noise_in_label_units(tmp_path):
    post = write_trace(tmp_path / "t.nc", "hierarchical", likelihood="gaussian")
    out = predict_table(tmp_path / "t.nc", NEW, "input")
    X = standardised()
    w = post["w_out"].sel(group="g1").values.reshape(-1, 2)
    sigma = Y_SD * post["sigma"].values.reshape(-1)
    mu = Y_MEAN + Y_SD * (w @ X[3])
    assert out.loc[3, "mean"] == pytest.approx(mu.mean(), abs=1e-6)
    assert out.loc[3, "sd"] == pytest.approx(np.sqrt(mu.var() + np.mean(sigma**2)), abs=1e-6)
    lo, hi = out.loc[3, "lower_94"], out.loc[3, "upper_94"]
    assert mixture_cdf(np.array([lo]), mu[:, None], sigma)[0] == pytest.approx(0.03, abs=1e-6)
    assert mixture_cdf(np.array([hi]), mu[:, None], sigma)[0] == pytest.approx(0.97, abs=1e-6)
    assert out["sd"].min() > Y_SD * 0.2  # never below the smallest noise sd


@pytest.mark.parametrize(
    "table, message",
    [
        (NEW.drop(columns="b"), "no column 'b' (feature)"),
        (NEW.drop(columns="shop"), "no column 'shop' (group column)"),
        (NEW.assign(a=[1.0, None, 2.0, 3.0]), "feature column 'a' has 1 missing value (row 2)"),
        (NEW.assign(a=["1", "2", "x", "3"]), "feature column 'a' is not numeric"),
        (NEW.assign(mean=1.0), "already has columns ['mean']"),
        (NEW.iloc[:0].astype(object), "input has no rows to score"),  # a header-only CSV
    ],
)
def test_bad_input_rows_are_named(tmp_path, table, message):
    write_trace(tmp_path / "t.nc", "hierarchical")
    with pytest.raises(InputError) as err:
        predict_table(tmp_path / "t.nc", table, "input")
    assert message in str(err.value)


def test_cli_writes_csv_and_reports_errors(tmp_path, capsys):
    write_trace(tmp_path / "hier.nc", "hierarchical")
    write_trace(tmp_path / "flat.nc", "flat")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    out = tmp_path / "scored.csv"
    assert cli.main(["predict", "--trace", str(tmp_path / "hier.nc"), "--input", str(tmp_path / "new.csv"),
                     "--output", str(out)]) == 0
    scored = pd.read_csv(out)
    assert len(scored) == len(NEW) and scored["unseen_group"].tolist() == [False, False, True, False]
    code = cli.main(["predict", "--trace", str(tmp_path / "flat.nc"), "--input", str(tmp_path / "new.csv"),
                     "--output", str(tmp_path / "other.csv")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "['new']" in err and "Traceback" not in err
    assert not (tmp_path / "other.csv").exists()
    assert cli.main(["predict", "--trace", str(tmp_path / "missing.nc"), "--input", str(tmp_path / "new.csv"),
                     "--output", str(out)]) == 2


def test_cli_refuses_a_column_named_twice_and_a_prior_file(tmp_path, capsys):
    """A header 'shop,a,a,b': pandas renamed the second 'a' to 'a.1', scored the first and wrote 'a.1' back; and
    priors/informed.nc passed as --trace said 'OSError: [Errno group not found: posterior]'."""
    write_trace(tmp_path / "hier.nc", "hierarchical")
    (tmp_path / "dup.csv").write_text("shop,a,a,b\ng1,1,2,3\n")
    args = ["predict", "--trace", str(tmp_path / "hier.nc"), "--input", str(tmp_path / "dup.csv"), "--output",
            str(tmp_path / "o.csv")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "has the column 'a' more than once" in err and not (tmp_path / "o.csv").exists()
    prior = xr.Dataset({"mean_in": ("k", np.zeros(2))}, attrs={"hbnn_stage": "derive_prior",
                                                               "hbnn_variant": "informed_prior"})
    prior.to_netcdf(tmp_path / "informed.nc")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    assert cli.main(["predict", "--trace", str(tmp_path / "informed.nc"), "--input", str(tmp_path / "new.csv"),
                     "--output", str(tmp_path / "o.csv")]) == 2
    assert "is an informed prior, not a trace" in capsys.readouterr().err


def test_cli_writes_parquet_where_the_output_name_says_so(tmp_path):
    write_trace(tmp_path / "hier.nc", "hierarchical")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    args = ["predict", "--trace", str(tmp_path / "hier.nc"), "--input", str(tmp_path / "new.csv"), "--output"]
    assert cli.main([*args, str(tmp_path / "scored.csv")]) == 0
    for name in ("scored.parquet", "scored.PQ"):
        assert cli.main([*args, str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes()[:4] == b"PAR1"  # Parquet, not CSV text under a .parquet name
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / name), pd.read_csv(tmp_path / "scored.csv"),
                                      check_exact=False, rtol=1e-12)


def test_hbnn_predict_loads_no_sampler_plotting_or_arviz():
    """`hbnn predict` on a few rows takes ~1 s, most of it pandas and xarray; arviz (~2 s), matplotlib,
    scikit-learn and the samplers are not imported on its path."""
    heavy = ("arviz", "matplotlib", "sklearn", "pymc", "pytensor", "nutpie", "jax", "scipy.optimize")
    code = f"import sys, hbnn.cli, hbnn.pipeline.predict; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("likelihood", ["poisson", "negative_binomial"])
def test_count_intervals_are_whole_counts(tmp_path, likelihood):
    write_trace(tmp_path / "t.nc", "hierarchical", likelihood=likelihood)
    NEW.to_csv(tmp_path / "new.csv", index=False)
    assert cli.main(["predict", "--trace", str(tmp_path / "t.nc"), "--input", str(tmp_path / "new.csv"), "--output",
                     str(tmp_path / "out.csv")]) == 0
    text = (tmp_path / "out.csv").read_text().splitlines()
    header = text[0].split(",")
    for line in text[1:]:
        cells = dict(zip(header, line.split(","), strict=True))
        assert cells["lower_94"].isdigit() and cells["upper_94"].isdigit(), line
