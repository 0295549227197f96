"""What the three estimators share: fitting a DataFrame, predicting, diagnostics and saving (:class:`BNNEstimator`).

An estimator's keywords are ``params.yaml``'s settings (:mod:`hbnn.api.settings`); ``fit`` turns the DataFrame into
tasks as ``make_data`` turns a table (:func:`hbnn.data.tables.frame_tasks`) and fits them with the fit stages' code
(:func:`hbnn.fitting.models.fit`); prediction is ``hbnn predict``'s (:func:`hbnn.pipeline.predict.score_columns`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

import hbnn.api.settings as settings
from hbnn.config import Params
from hbnn.data.spec import DataSpec
from hbnn.data.tables import frame_tasks
from hbnn.data.tasks import Tasks
from hbnn.errors import InputError
from hbnn.files.io import settings_from_attrs
from hbnn.fitting.common import Fit, model_spec
from hbnn.model import likelihoods
from hbnn.model.spec import ModelSpec

JUDGED_ON_TRAINING = "training inputs"  # the tasks' ``test_rows`` attr of a fit without held-out rows


class BNNEstimator(BaseEstimator):
    """The estimators' shared behaviour; use :class:`hbnn.HierarchicalBNN`, :class:`hbnn.FlatBNN` or
    :class:`hbnn.InformedBNN`.

    A subclass names its fit (``_stage``: its seed stream and its model) and its keywords (``_names``: keyword to
    dotted params key).
    """

    _stage: ClassVar[str]
    _names: ClassVar[dict[str, str]]

    # ----------------------------------------------------------------------------------------------- settings
    @classmethod
    def from_params(cls, params: Params, **extra: Any) -> BNNEstimator:
        """The estimator a fit stage runs: the settings of ``params`` (``params.yaml``) as keywords.

        Parameters
        ----------
        params : hbnn.config.Params
            The checked params.
        **extra
            Keywords ``params`` does not hold (the informed prior).

        Returns
        -------
        BNNEstimator
            Unfitted.
        """
        return cls(**settings.from_params(params, cls._names), **extra)

    def set_params(self, **values: Any) -> BNNEstimator:
        """Change settings, as scikit-learn's ``set_params``; an unknown one is an :class:`~hbnn.errors.InputError`.

        Parameters
        ----------
        **values
            Settings by keyword.

        Returns
        -------
        BNNEstimator
            ``self``.
        """
        bad = {k: v for k, v in values.items() if k not in self.get_params(deep=False)}
        if bad:
            raise settings.unknown(type(self), bad)
        return super().set_params(**values)

    def _settings(self) -> dict[str, Any]:
        return {kw: getattr(self, kw) for kw in self._names}

    def params_for(self, features: list[str], label: str) -> Params:
        """The checked params a fit of these settings reads, on data with these feature columns and label.

        Parameters
        ----------
        features : list of str
            The feature columns.
        label : str
            The label's name.

        Returns
        -------
        hbnn.config.Params

        Raises
        ------
        hbnn.errors.InputError
            Naming the setting whose value cannot be used.
        """
        return settings.to_params(self._settings(), self._names, features, label)

    # ----------------------------------------------------------------------------------------------- fitting
    def fit(self, X: pd.DataFrame, y) -> BNNEstimator:
        """Fit the model to the rows of ``X`` and their labels ``y``.

        Parameters
        ----------
        X : pandas.DataFrame
            The features (every column but the group column and the split column, in order) and the group
            column (``group``); with ``split``, a column of ``"train"``/``"test"``: test rows are held out, and each
            group is scored and judged (convergence) on its test rows. Without ``split`` every row trains and each
            group is judged on its training inputs.
        y : array-like
            One label per row of ``X`` (0/1 for ``bernoulli``, numbers for ``gaussian``, counts for ``poisson`` and
            ``negative_binomial``).

        Returns
        -------
        BNNEstimator
            ``self``, fitted.

        Raises
        ------
        hbnn.errors.InputError
            Naming the setting, column, row or group that cannot be used (before anything is sampled), or a fit
            estimated past ``max_minutes`` or ``max_memory_gib``.
        """
        X = _frame(X, "X")
        values = np.asarray(y)
        if values.ndim != 1 or values.size != len(X):
            raise InputError(f"y must hold one label per row of X ({len(X)} rows); it has shape {values.shape}")
        label = y.name if isinstance(y, pd.Series) and isinstance(y.name, str) and y.name else "y"
        roles = [self.group, *([self.split] if self.split else [])]
        for role, column in zip(("group", "split"), roles, strict=False):
            if column not in X.columns:
                raise InputError(f"X has no column {column!r} (the {role} column, setting {role}); its columns are "
                                 f"{list(X.columns)}")
        if label in X.columns:
            raise InputError(f"y is named {label!r}, which is also a column of X; drop that column from X (a label "
                             "among the features) or rename y")
        features = [c for c in X.columns if c not in roles]
        # error messages number rows from 1 in X's order; say so where X's index would suggest other numbers
        where = "X and y" if X.index.equals(pd.RangeIndex(len(X))) else "X and y (rows numbered from 1 in X's order)"
        try:
            params = self.params_for(features, label)
            df = X.loc[:, [*features, *roles]].copy()
            df[label] = values
            tasks = Tasks(frame_tasks(df, DataSpec.of(params), where, all_train=not self.split))
            self.fit_tasks(tasks, params)
        except InputError as err:
            raise InputError(settings.renamed(str(err), self._names)) from None
        return self

    def fit_tasks(self, tasks: Tasks, params: Params | None = None) -> Fit:
        """Fit tasks already made (``data/tasks.nc``): the fit stages' entry, which :meth:`fit` also takes.

        Parameters
        ----------
        tasks : hbnn.data.tasks.Tasks
            The data, with its split.
        params : hbnn.config.Params, optional
            The params of these settings (:meth:`params_for`), where already built.

        Returns
        -------
        hbnn.fitting.common.Fit
            The scored fit, which the stages write.
        """
        from hbnn.fitting.models import fit

        if params is None:
            params = self.params_for(tasks.features, str(tasks.ds.attrs.get("label_column", "y")))
        spec = model_spec(params, tasks)
        layer_prior, extra = self._prior(spec)
        result = fit(self._stage, params, spec, tasks, layer_prior, extra)
        metrics = result.metrics
        if tasks.ds.attrs.get("test_rows") == JUDGED_ON_TRAINING:  # the "test" scores would be the training rows'
            metrics = {k: v for k, v in metrics.items() if k != "test"}
            metrics["per_group"] = {g: {k: v for k, v in m.items() if k != "test"}
                                    for g, m in metrics["per_group"].items()}
        self._fitted(result.trace, metrics, result.timing)
        return result

    def _prior(self, spec: ModelSpec) -> tuple[dict | None, dict | None]:
        """The informed prior's layers for ``spec``'s network and the settings recorded about it (the informed model
        only)."""
        return None, None

    def _fitted(self, trace, metrics: dict | None = None, timing: dict | None = None) -> None:
        """Set the fitted attributes from a trace (and, fitted here, its metrics and timing)."""
        found = settings_from_attrs(trace.posterior.attrs, "the trace")
        self.trace_ = trace
        self.metrics_ = metrics
        self.timing_ = timing
        self.feature_names_in_ = np.array(found.get("features") or [str(f) for f in trace.posterior["feature"].values],
                                          dtype=object)
        self.n_features_in_ = len(self.feature_names_in_)
        self.groups_ = [str(g) for g in trace.posterior["group"].values]
        self.likelihood_ = str(found.get("likelihood", "bernoulli"))
        self.group_column_ = str(found.get("group_column", self.group))
        if likelihoods.get(self.likelihood_).classifier:
            self.classes_ = np.array([0, 1])
        self.__dict__.pop("_idata", None)

    def _check_fitted(self) -> None:
        if not hasattr(self, "trace_"):
            raise InputError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) or hbnn.load(path) first")

    @property
    def idata_(self):
        """The fit's trace as an ArviZ ``InferenceData``, laid out as the pipeline's ``traces/*.nc``."""
        self._check_fitted()
        if "_idata" not in self.__dict__:
            self.__dict__["_idata"] = self.trace_.to_arviz() if hasattr(self.trace_, "to_arviz") else self.trace_
        return self.__dict__["_idata"]

    # ----------------------------------------------------------------------------------------------- results
    def diagnostics(self) -> pd.DataFrame:
        """The convergence of each group's fit, as the pipeline's metrics judge it.

        Returns
        -------
        pandas.DataFrame
            One row per group: ``rhat`` (largest R-hat) and ``ess_bulk`` (smallest bulk ESS) of the predictions at the
            points the group is judged on, ``divergences`` (its fit's; the hierarchical model's are the joint fit's)
            and ``converged``: R-hat <= 1.01, bulk ESS >= 400 and divergences within 0.1% of the draws
            (:func:`hbnn.diagnostics.criterion.group_converged`).

        Raises
        ------
        hbnn.errors.InputError
            If not fitted, or the trace holds no diagnostics.
        """
        self._check_fitted()
        raw = self.trace_.sample_stats.attrs.get("hbnn_diagnostics")
        if raw is None:
            raise InputError("the trace holds no per-group diagnostics (its sample_stats lack the hbnn_diagnostics "
                             "attribute); fit it again with this version of hbnn")
        table = pd.DataFrame.from_dict(json.loads(raw), orient="index")
        table.index.name = "group"
        return table.loc[self.groups_, ["rhat", "ess_bulk", "divergences", "converged"]]

    def predict_summary(self, X: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
        """Each row's posterior summary: ``hbnn predict``'s columns, unrounded (its file rounds them to 6 decimals).

        Parameters
        ----------
        X : pandas.DataFrame
            The feature columns and the group column the model was fitted with. A group the model has not seen is
            predicted through the population (the hierarchical model only; the others refuse it).
        seed : int, optional
            Seed of the new-group draws for unseen groups.

        Returns
        -------
        pandas.DataFrame
            Indexed as ``X``: ``mean``, ``sd``, ``lower_94``, ``upper_94`` (bernoulli: of ``P(y = 1)``; the other
            likelihoods: of the posterior predictive of ``y``, noise included) and ``unseen_group``.

        Raises
        ------
        hbnn.errors.InputError
            Naming the missing column, the bad value or the unseen group.
        """
        from hbnn.pipeline.predict import OUTPUT_COLUMNS, score_columns

        self._check_fitted()
        X = _frame(X, "X")
        needed = [*map(str, self.feature_names_in_), self.group_column_]
        columns = score_columns(self.trace_, X.loc[:, [c for c in needed if c in X.columns]], "X", seed)
        return pd.DataFrame({c: columns[c] for c in OUTPUT_COLUMNS}, index=X.index)

    def predict_proba(self, X: pd.DataFrame) -> np.ndarray:
        """Posterior mean class probabilities (``bernoulli`` only).

        Parameters
        ----------
        X : pandas.DataFrame
            As :meth:`predict_summary`.

        Returns
        -------
        numpy.ndarray
            ``(n, 2)``: ``P(y = 0)`` and ``P(y = 1)`` per row.

        Raises
        ------
        hbnn.errors.InputError
            For a likelihood other than ``bernoulli``, and as :meth:`predict_summary`.
        """
        self._check_fitted()
        if not likelihoods.get(self.likelihood_).classifier:
            raise InputError(f"predict_proba needs a classifier (likelihood 'bernoulli'); this model's likelihood is "
                             f"{self.likelihood_!r}: use predict or predict_summary")
        p = self.predict_summary(X)["mean"].to_numpy()
        return np.column_stack([1 - p, p])

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Point predictions: the more probable class (``bernoulli``: ``P(y = 1) >= 0.5``), else the posterior
        predictive mean.

        Parameters
        ----------
        X : pandas.DataFrame
            As :meth:`predict_summary`.

        Returns
        -------
        numpy.ndarray
            One value per row.
        """
        mean = self.predict_summary(X)["mean"].to_numpy()
        return (mean >= 0.5).astype(np.int64) if likelihoods.get(self.likelihood_).classifier else mean

    def score(self, X: pd.DataFrame, y) -> float:
        """Accuracy (``bernoulli``) or the coefficient of determination R² of the predictive mean (the others), as
        scikit-learn's classifiers and regressors score: higher is better.

        Parameters
        ----------
        X : pandas.DataFrame
            As :meth:`predict_summary`.
        y : array-like
            The rows' labels.

        Returns
        -------
        float
        """
        from sklearn.metrics import accuracy_score, r2_score

        self._check_fitted()
        y = np.asarray(y)
        if likelihoods.get(self.likelihood_).classifier:
            return float(accuracy_score(y, self.predict(X)))
        return float(r2_score(y, self.predict(X)))

    def save(self, path: str | Path) -> Path:
        """Write the fit's trace as NetCDF (atomically), readable by :func:`hbnn.load` and ``az.from_netcdf``.

        Parameters
        ----------
        path : str or pathlib.Path
            Where.

        Returns
        -------
        pathlib.Path
            ``path``.
        """
        from hbnn.files.outputs import write_netcdf

        self._check_fitted()
        write_netcdf(self.trace_, path)
        return Path(path)

    def __sklearn_tags__(self):
        """scikit-learn's tags: a classifier for ``bernoulli`` (scorers such as ``roc_auc`` then take
        :meth:`predict_proba`, an integer ``cv`` stratifies), a regressor otherwise."""
        from sklearn.utils import ClassifierTags, RegressorTags

        tags = super().__sklearn_tags__()
        tags.non_deterministic = False  # the same settings and rows give the same draws
        known = self.likelihood in likelihoods.LIKELIHOODS
        if known and likelihoods.get(self.likelihood).classifier:
            tags.estimator_type, tags.classifier_tags = "classifier", ClassifierTags()
        elif known:
            tags.estimator_type, tags.regressor_tags = "regressor", RegressorTags()
        return tags


def _frame(X: Any, what: str) -> pd.DataFrame:
    """``X`` checked to be a DataFrame with text column names."""
    if not isinstance(X, pd.DataFrame):
        raise InputError(f"{what} must be a pandas DataFrame holding the feature columns and the group column; got "
                         f"{type(X).__name__}")
    bad = [c for c in X.columns if not isinstance(c, str)]
    if bad:
        raise InputError(f"{what}'s column names must be text; {bad[:3]} are not (name the columns)")
    twice = sorted({c for c in X.columns if list(X.columns).count(c) > 1})
    if twice:
        raise InputError(f"{what} has the column {twice[0]!r} more than once; each column needs its own name")
    return X
