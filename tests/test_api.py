"""The Python API: settings as params.yaml's, one code path with the stages, predictions as ``hbnn predict``'s, bad
input as one InputError."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

import hbnn
from hbnn.api import settings
from hbnn.api.estimators import FlatBNN, HierarchicalBNN, InformedBNN
from hbnn.config import Params
from hbnn.config_read import parse_params
from hbnn.errors import InputError
from hbnn.pipeline.variants import STAGE_PARAMS

ESTIMATORS = (HierarchicalBNN, FlatBNN, InformedBNN)
# tiny fits: no looks past their draws, no refits
TINY = {"chains": 2, "tune": 40, "draws": 25, "max_draws": 0}
TINY_HIER = {**TINY, "restarts": 0, "target_accept": 0.9, "mass_matrix": "diag"}


def table(n_groups: int = 3, rows: int = 24, seed: int = 0) -> tuple[pd.DataFrame, pd.Series]:
    """Groups of a rotated linear boundary, half of each group's rows marked test."""
    rng = np.random.default_rng(seed)
    frames = []
    for g in range(n_groups):
        x = rng.normal(size=(rows, 2))
        angle = 0.6 * g
        p = 1 / (1 + np.exp(-3 * (np.cos(angle) * x[:, 0] + np.sin(angle) * x[:, 1])))
        y = (rng.uniform(size=rows) < p).astype(int)
        y[:2], y[rows // 2:rows // 2 + 2] = (0, 1), (0, 1)  # both classes among training and test rows
        frames.append(pd.DataFrame({"site": f"s{g}", "a": x[:, 0] * 10 + 50, "b": x[:, 1], "part":
                                    ["train"] * (rows // 2) + ["test"] * (rows - rows // 2), "failed": y}))
    df = pd.concat(frames, ignore_index=True)
    return df.drop(columns="failed"), df["failed"]


# ------------------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_keyword_defaults_are_the_params_defaults(cls):
    made = cls().get_params()
    expected = settings.from_params(Params(), cls._names)
    expected["group"] = "group"  # the API's group column default; params.yaml's names the example table's
    assert {k: made[k] for k in cls._names} == {k: (tuple(v) if isinstance(v, list) else v)
                                                for k, v in expected.items()}


def _everything_changed() -> Params:
    """Params with every key an estimator reads away from its default."""
    return parse_params({
        "model": {"hidden_layers": [3], "activation": "relu", "likelihood": "bernoulli", "bias": True, "noise_sd": 2.0,
                  "prior_sd": 0.5},
        "sampler": {"backend": "pymc", "chains": 3, "tune": 11, "draws": 12, "target_accept": 0.8, "seed": 9,
                    "cores": 1, "mass_matrix": "diag_stan", "max_draws": 24, "refit_target_accept": 0.95,
                    "advi": {"iterations": 5, "learning_rate": 0.1, "minibatch_size": 7, "init_jitter": 0.1}},
        "hier_sampler": {"backend": "numpyro", "chains": 3, "tune": 13, "draws": 14, "target_accept": 0.85,
                         "seed": 8, "cores": 1, "mass_matrix": "diag", "max_draws": 28, "restarts": 1,
                         "advi": {"iterations": 6, "learning_rate": 0.2, "minibatch_size": 3, "init_jitter": 0.2}},
        "trace": {"pointwise": False}, "limits": {"max_minutes": 7, "max_memory_gib": 3},
        "data": {"source": "table", "group": "shop", "split": "part", "standardize": False},
    })


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_an_estimator_from_params_reads_every_setting_its_stage_reads(cls):
    params = _everything_changed()
    extra = {"prior": "p.nc"} if cls is InformedBNN else {}
    rebuilt = cls.from_params(params, **extra).params_for(list(params.data.features), params.data.label)
    assert rebuilt.section_hash(*STAGE_PARAMS[cls._stage]) == params.section_hash(*STAGE_PARAMS[cls._stage])
    assert rebuilt.limits == params.limits
    assert (rebuilt.data.group, rebuilt.data.split, rebuilt.data.standardize) == ("shop", "part", False)


def test_hbnn_exports_the_api():
    assert {"HierarchicalBNN", "FlatBNN", "InformedBNN", "load", "InputError"} <= set(dir(hbnn))
    assert issubclass(hbnn.InputError, ValueError)
    with pytest.raises(AttributeError):
        hbnn.NotAThing  # noqa: B018


def test_clone_and_set_params_keep_the_settings():
    model = HierarchicalBNN(group="site", tune=300, hidden_layers=(4,))
    copy = clone(model)
    assert copy.get_params() == model.get_params() and copy is not model
    assert copy.set_params(draws=200).draws == 200


# ------------------------------------------------------------------------------------------------------- bad input
X, Y = table()


@pytest.mark.parametrize("make, fit_args, names", [
    (lambda: HierarchicalBNN(group="shop"), (X, Y), ["'shop'", "group column"]),
    (lambda: HierarchicalBNN(group="site", split="part", tune=-1), (X, Y), ["tune=-1"]),
    (lambda: FlatBNN(group="site", split="part", hidden_layers="5"), (X, Y), ["hidden_layers"]),
    (lambda: FlatBNN(group="site", split="part"), (X.assign(a=np.where(X.index == 3, np.inf, X["a"])), Y),
     ["'a'", "non-finite", "row 4"]),
    (lambda: FlatBNN(group="site", split="part"), (X, Y.astype(float) + 0.5), ["'failed'"]),
    (lambda: FlatBNN(group="site", split="part"), (X, Y.astype(str).replace("1", "yes")), ["'failed'", "'yes'"]),
    (lambda: FlatBNN(group="site", split="part"), (X.to_numpy(), Y), ["pandas DataFrame"]),
    (lambda: FlatBNN(group="site", split="part"), (X, Y[:5]), ["one label per row"]),
    (lambda: InformedBNN(group="site", split="part"), (X, Y), ["prior"]),
    (lambda: HierarchicalBNN(group="site", split="part", max_minutes=1e-9), (X, Y), ["max_minutes"]),
    (lambda: FlatBNN(group="site", split="part"), (X, Y + 1j), ["'failed'", "complex"]),
    (lambda: FlatBNN(group="site", split="part", likelihood="gaussian"), (X, pd.to_datetime(Y, unit="D")),
     ["'failed'", "dates"]),
    (lambda: FlatBNN(group="site", split="part"), (X, Y.rename("a")), ["y is named 'a'"]),
    (lambda: FlatBNN(group="site", split="part"), (pd.concat([X, X[["a"]]], axis=1), Y), ["'a' more than once"]),
    (lambda: FlatBNN(group="site", split="part"), (X.set_index(X.index + 100).assign(b=np.nan), Y),
     ["'b'", "numbered from 1 in X's order"]),
])
def test_bad_input_is_one_input_error_naming_it(make, fit_args, names):
    with pytest.raises(InputError) as err:
        make().fit(*fit_args)
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message


def test_an_unknown_setting_is_an_input_error_naming_it():
    with pytest.raises(InputError, match="'tunes'.*did you mean 'tune'"):
        HierarchicalBNN(tunes=3)
    with pytest.raises(InputError, match="'drawz'"):
        FlatBNN().set_params(drawz=3)


def test_an_unfitted_estimator_says_so():
    with pytest.raises(InputError, match="not fitted"):
        FlatBNN().predict(X)
    with pytest.raises(InputError, match="not fitted"):
        FlatBNN().score(X, Y)


def test_a_missing_group_column_is_named_with_xs_columns_only():
    with pytest.raises(InputError) as err:
        FlatBNN(group="shop").fit(X, Y)
    assert "'shop'" in str(err.value) and "'failed'" not in str(err.value)


def test_the_estimator_type_follows_the_likelihood():
    from sklearn.base import is_classifier, is_regressor

    assert is_classifier(FlatBNN()) and not is_regressor(FlatBNN())
    assert is_regressor(FlatBNN(likelihood="poisson")) and not is_classifier(HierarchicalBNN(likelihood="gaussian"))


def test_an_unreadable_trace_is_one_line(tmp_path):
    (tmp_path / "t.nc").write_text("not a trace\n" * 20)
    with pytest.raises(InputError) as err:
        hbnn.load(tmp_path / "t.nc")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------------- fitting
@pytest.fixture(scope="module")
def fitted_hier():
    return HierarchicalBNN(group="site", split="part", **TINY_HIER).fit(X, Y)


def test_the_stage_and_the_api_give_the_same_draws_and_metrics(tmp_path, fitted_hier):
    """The fit stage on the table, as make_data stores it, and the estimator on the same DataFrame."""
    from hbnn.data.spec import DataSpec
    from hbnn.data.tables import load_table_tasks
    from hbnn.files.outputs import write_netcdf
    from hbnn.pipeline.stages.fit_hier import fit_hier

    path = tmp_path / "t.csv"
    pd.concat([X, Y], axis=1).to_csv(path, index=False)
    params = parse_params({"data": {"source": "table", "path": str(path), "features": ["a", "b"], "label": "failed",
                                    "group": "site", "split": "part"},
                           "hier_sampler": TINY_HIER})
    write_netcdf(load_table_tasks(DataSpec.of(params)), tmp_path / "tasks.nc")
    out = tmp_path / "out"
    metrics = fit_hier(params, tmp_path / "tasks.nc", out / "hier.nc", out / "hier.json", out / "timing.json")
    metrics.pop("made_by")
    assert json.dumps(metrics, sort_keys=True, default=str) == json.dumps(fitted_hier.metrics_, sort_keys=True,
                                                                          default=str)
    loaded = hbnn.load(out / "hier.nc")
    for name in fitted_hier.trace_.posterior.data_vars:
        np.testing.assert_array_equal(loaded.trace_.posterior[name].values, fitted_hier.trace_.posterior[name].values)
    pd.testing.assert_frame_equal(loaded.diagnostics(), fitted_hier.diagnostics())


def test_a_fitted_model_predicts_diagnoses_and_survives_a_round_trip(tmp_path, fitted_hier):
    diag = fitted_hier.diagnostics()
    assert list(diag.index) == ["s0", "s1", "s2"]
    assert list(diag.columns) == ["rhat", "ess_bulk", "divergences", "converged"]
    new = X.assign(site=np.where(X.index % 5 == 0, "unseen", X["site"]))
    summary = fitted_hier.predict_summary(new)
    assert summary["unseen_group"].to_numpy().tolist() == (new["site"] == "unseen").tolist()
    assert ((summary["lower_94"] <= summary["mean"]) & (summary["mean"] <= summary["upper_94"])).all()
    proba = fitted_hier.predict_proba(new)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert 0.5 < fitted_hier.score(X, Y) <= 1.0
    from sklearn.metrics import get_scorer

    assert 0.5 < get_scorer("roc_auc")(fitted_hier, X, Y) <= 1.0  # a classifier: the scorer takes predict_proba
    assert fitted_hier.idata_.posterior.sizes["draw"] == TINY["draws"]
    loaded = hbnn.load(fitted_hier.save(tmp_path / "m.nc"))
    assert isinstance(loaded, HierarchicalBNN) and loaded.group == "site"
    np.testing.assert_array_equal(loaded.predict_proba(new), proba)
    pd.testing.assert_frame_equal(loaded.diagnostics(), diag)


def test_without_a_split_every_row_trains_and_no_test_scores_are_claimed():
    numbered = X.drop(columns="part").assign(site=X["site"].str[1:].astype(int))  # groups 0, 1, 2
    model = FlatBNN(group="site", **TINY).fit(numbered, Y)
    # a group column read back as floats (a NaN once in it) names the same groups
    assert not model.predict_summary(numbered.assign(site=numbered["site"].astype(float)))["unseen_group"].any()
    assert model.trace_.observed_data.sizes["obs"] == len(X)
    assert "test" not in model.metrics_ and all("test" not in g for g in model.metrics_["per_group"].values())
    assert model.diagnostics()["rhat"].notna().all()


def test_an_informed_model_takes_the_prior_of_a_fitted_hierarchical_model(fitted_hier):
    prior = fitted_hier.informed_prior(draws_per_sample=2)
    model = InformedBNN(prior, group="site", split="part", **TINY).fit(X, Y)
    assert model.diagnostics().shape[0] == 3
    with pytest.raises(InputError, match="align"):
        fitted_hier.informed_prior(align="none")
    assert clone(InformedBNN(prior)).prior.identical(prior)


def test_the_plugin_prior_is_the_top_draws_mu_from_the_api(fitted_hier):
    """``method="plugin"``: ``mean_in`` is ``mu_in`` at the draw of the highest ``logp``, and the file says so."""
    prior = fitted_hier.informed_prior(method="plugin")
    logp = fitted_hier.trace_.sample_stats["logp"].transpose("chain", "draw").values
    top = np.unravel_index(int(np.argmax(logp)), logp.shape)
    mu_in = fitted_hier.trace_.posterior["mu_in"].transpose("chain", "draw", ...).values[top]
    np.testing.assert_array_equal(prior["mean_in"].values, mu_in.reshape(-1))
    assert json.loads(prior.attrs["hbnn_settings"])["prior"]["method"] == "plugin"
    with pytest.raises(InputError, match="method='foo'"):
        fitted_hier.informed_prior(method="foo")


def test_loading_a_pipeline_trace_predicts_as_hbnn_predict(tmp_path):
    from hbnn import cli
    from tests.test_predict import NEW, write_trace

    write_trace(tmp_path / "hier.nc", "hierarchical")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    assert cli.main(["predict", "--trace", str(tmp_path / "hier.nc"), "--input", str(tmp_path / "new.csv"),
                     "--output", str(tmp_path / "out.csv")]) == 0
    written = pd.read_csv(tmp_path / "out.csv")
    proba = hbnn.load(tmp_path / "hier.nc").predict_proba(NEW)
    np.testing.assert_allclose(proba[:, 1], written["mean"], atol=5e-7)


def test_cross_validation_by_group_predicts_unseen_groups_through_the_population():
    from sklearn.model_selection import GroupKFold, cross_val_score

    Xs = X.drop(columns="part")
    scores = cross_val_score(HierarchicalBNN(group="site", **TINY_HIER), Xs, Y, cv=GroupKFold(3), groups=Xs["site"])
    assert scores.shape == (3,) and np.all((0 <= scores) & (scores <= 1))


def test_the_dataclass_of_settings_matches_the_keywords():
    """A sampler setting added to params.yaml is an estimator keyword too (or this test names it)."""
    from hbnn.config import SamplerParams

    fields = {f.name for f in dataclasses.fields(SamplerParams)} - {"advi"}
    assert fields - set(HierarchicalBNN._names) == {"refit_target_accept"}  # must be 0 for the hierarchical fit
    assert fields - set(FlatBNN._names) == {"restarts"}  # the per-group fits refit longer instead
