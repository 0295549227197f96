"""Stage ``baselines``: non-Bayesian reference models on exactly the BNNs' rows, split and scores.

Every model is a scikit-learn estimator, fitted on the training rows of ``data/tasks.nc`` (the features as
stored, which ``make_data`` already standardised where asked; gaussian labels on the model's standardised scale,
predictions back in the label's units). Each model's test-row predictions are put in the shape
:func:`hbnn.diagnostics.predictions.evaluate_groups` gives the BNNs (one "draw" per row) and scored by
:func:`hbnn.diagnostics.predictions.split_scores`, the likelihood's own ``pointwise`` and ``scores``, so a metric
named like a BNN's is computed the same way:

- bernoulli: the predicted ``P(y = 1)``; accuracy, log loss, Brier.
- gaussian: the predicted mean with the training rows' root-mean-square residual as the predictive noise sd
  (a normal predictive); RMSE, lpd, 94% coverage.
- poisson and negative_binomial: the predicted rate with a Poisson predictive (scored by the poisson likelihood:
  no model here estimates a dispersion); RMSE, lpd, 94% coverage.

The models (:data:`MODELS`):

``pooled_glm``
    One GLM on every group's training rows, the group ignored: LogisticRegression, LinearRegression,
    PoissonRegressor.
``group_glm``
    The GLM with group effects: one-hot group columns and group x feature interaction columns beside the shared
    features, i.e. a varying-intercept, varying-slope model. The groups of the default data differ by a rotation,
    which is a difference in slopes, so intercepts alone would leave the groups' differences out. scikit-learn's
    default L2 penalty (LogisticRegression C=1, Ridge alpha=1, PoissonRegressor alpha=1) shrinks each group's
    deviation towards the shared coefficients, the role a mixed model's group variance plays.
``per_group_glm``
    One GLM per group on its own training rows (LogisticRegression, LinearRegression, PoissonRegressor). A
    classifier group whose training labels are all one class predicts its training rate clipped to
    ``[EPS, 1 - EPS]`` (the likelihood's clip, :data:`hbnn.model.likelihoods.base.EPS`) for every row: a logistic
    regression cannot be fitted to one class. A gaussian group with no more training rows than coefficients
    takes the pooled GLM's noise sd (its own residuals are all zero).
``gradient_boosting``
    HistGradientBoostingClassifier / HistGradientBoostingRegressor (loss "poisson" for counts) with the group as
    a categorical feature (as an ordinal code past 255 groups, the most categories it takes), seeded from
    ``baselines.seed``.

Iterative fits run to ``MAX_ITER`` iterations, so they converge where scikit-learn's 100 stop short.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from hbnn.config import Params
from hbnn.data.tasks import Tasks
from hbnn.diagnostics.predictions import split_scores
from hbnn.files.io import as_builtin, made_by
from hbnn.files.outputs import detail_path, staged_outputs
from hbnn.model import likelihoods
from hbnn.model.likelihoods.base import EPS
from hbnn.pipeline.stages import load_run_tasks
from hbnn.pipeline.variants import STAGE_KEYS, derive_seed

log = logging.getLogger(__name__)

MODELS = ("pooled_glm", "group_glm", "per_group_glm", "gradient_boosting")

LABELS = {"pooled_glm": "Pooled GLM", "group_glm": "GLM with group effects", "per_group_glm": "GLM per group",
          "gradient_boosting": "Gradient boosting"}

MAX_ITER = 1000  # lbfgs iterations of the GLMs: scikit-learn's default 100 stops short on some groups

MAX_CATEGORIES = 255  # HistGradientBoosting's limit on a categorical feature's categories


def scoring_likelihood(name: str) -> likelihoods.Likelihood:
    """The likelihood that scores the baselines of tasks made for ``name``.

    It is the tasks' own likelihood, except for negative_binomial counts, which the baselines predict with a
    Poisson predictive (no baseline estimates a dispersion).

    Parameters
    ----------
    name : str
        The tasks' likelihood name (``model.likelihood``).

    Returns
    -------
    hbnn.model.likelihoods.Likelihood
        The registered likelihood that scores the baselines.
    """
    return likelihoods.get("poisson" if name == "negative_binomial" else name)


def _glm(kind: str, regularised: bool):
    """A fresh scikit-learn GLM for ``kind`` (classifier, gaussian or count); ``regularised`` picks Ridge over
    LinearRegression for gaussian labels (the other two are regularised by default)."""
    from sklearn.linear_model import LinearRegression, LogisticRegression, PoissonRegressor, Ridge

    if kind == "classifier":
        return LogisticRegression(max_iter=MAX_ITER)
    if kind == "count":
        return PoissonRegressor(max_iter=MAX_ITER)
    return Ridge() if regularised else LinearRegression()


def _kind(tasks: Tasks) -> str:
    lik = likelihoods.get(tasks.likelihood)
    return "classifier" if lik.classifier else ("gaussian" if lik.standardise_labels else "count")


def _predict(model, kind: str, X: np.ndarray) -> np.ndarray:
    """``P(y = 1)``, the mean or the rate at rows ``X``."""
    return model.predict_proba(X)[:, 1] if kind == "classifier" else model.predict(X)


def _design(X: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Shared features, one-hot group columns and group x feature interactions (:data:`MODELS`' ``group_glm``)."""
    onehot = np.zeros((X.shape[0], n_groups))
    onehot[np.arange(X.shape[0]), group] = 1.0
    inter = (onehot[:, :, None] * X[:, None, :]).reshape(X.shape[0], -1)
    return np.hstack([X, onehot, inter])


def _rms(r: np.ndarray) -> float:
    return float(np.sqrt(np.mean(r**2)))


def fit_predict(model: str, tasks: Tasks, seed: int) -> dict[str, tuple[np.ndarray, float | None]]:
    """Fit one baseline on the training rows of ``tasks`` and predict every row of each split.

    Parameters
    ----------
    model : str
        One of :data:`MODELS`.
    tasks : hbnn.data.tasks.Tasks
        The tasks, split into training and test rows.
    seed : int
        ``gradient_boosting``'s ``random_state`` (:func:`baseline_seed`).

    Returns
    -------
    dict of str to tuple of (numpy.ndarray, numpy.ndarray or None)
        ``{split: (prediction, noise_sd)}``: the predictions ``(n,)`` in the split's (group-sorted) order on the
        model's label scale, and the gaussian noise sd per row on that scale (``None`` for other labels).

    Raises
    ------
    ValueError
        If ``model`` is not one of :data:`MODELS`.
    """
    kind = _kind(tasks)
    train, splits = tasks.split("train"), {s: tasks.split(s) for s in ("train", "test")}
    k = tasks.n_groups
    preds: dict[str, np.ndarray] = {}
    sd: dict[str, np.ndarray] | None = None
    if model == "pooled_glm":
        fitted = _glm(kind, False).fit(train.X, train.y)
        preds = {s: _predict(fitted, kind, sp.X) for s, sp in splits.items()}
        noise = _rms(train.y - preds["train"])
        sd = {s: np.full(sp.y.size, noise) for s, sp in splits.items()}
    elif model == "group_glm":
        fitted = _glm(kind, True).fit(_design(train.X, train.group, k), train.y)
        preds = {s: _predict(fitted, kind, _design(sp.X, sp.group, k)) for s, sp in splits.items()}
        noise = _rms(train.y - preds["train"])
        sd = {s: np.full(sp.y.size, noise) for s, sp in splits.items()}
    elif model == "per_group_glm":
        pooled = _rms(train.y - _predict(_glm(kind, False).fit(train.X, train.y), kind, train.X))
        preds = {s: np.empty(sp.y.size) for s, sp in splits.items()}
        sd = {s: np.empty(sp.y.size) for s, sp in splits.items()}
        for g in range(k):
            rows = train.rows(g)
            X, y = train.X[rows], train.y[rows]
            one_class = kind == "classifier" and np.unique(y).size < 2
            fitted = None if one_class or not rows.size else _glm(kind, False).fit(X, y)
            noise = pooled if rows.size <= X.shape[1] + 1 else None
            for s, sp in splits.items():
                r = sp.rows(g)
                if fitted is None:
                    rate = np.clip(y.mean(), EPS, 1 - EPS) if rows.size else 0.5
                    preds[s][r] = rate
                else:
                    preds[s][r] = _predict(fitted, kind, sp.X[r])
            if noise is None:
                noise = _rms(y - preds["train"][rows])
            for s, sp in splits.items():
                sd[s][sp.rows(g)] = noise
    elif model == "gradient_boosting":
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        categorical = [train.X.shape[1]] if k <= MAX_CATEGORIES else None
        if kind == "classifier":
            fitted = HistGradientBoostingClassifier(categorical_features=categorical, random_state=seed)
        else:
            fitted = HistGradientBoostingRegressor(loss="poisson" if kind == "count" else "squared_error",
                                                   categorical_features=categorical, random_state=seed)
        fitted.fit(np.column_stack([train.X, train.group]), train.y)
        preds = {s: _predict(fitted, kind, np.column_stack([sp.X, sp.group])) for s, sp in splits.items()}
        noise = _rms(train.y - preds["train"])
        sd = {s: np.full(sp.y.size, noise) for s, sp in splits.items()}
    else:
        raise ValueError(f"unknown baseline {model!r}")
    return {s: (preds[s], sd[s] if kind == "gaussian" else None) for s in splits}


def predictions(model: str, tasks: Tasks, seed: int) -> dict[str, dict[str, list]]:
    """:func:`fit_predict` in the shape :func:`hbnn.diagnostics.predictions.evaluate_groups` gives a BNN's draws.

    Parameters
    ----------
    model : str
        One of :data:`MODELS`.
    tasks : hbnn.data.tasks.Tasks
        The tasks.
    seed : int
        ``gradient_boosting``'s ``random_state``.

    Returns
    -------
    dict of str to dict
        Per split: ``draws`` (per group, ``(1, 1, n_g)`` in the label's units), ``noise`` (per group ``(1, 1)``;
        gaussian only, else ``None``) and ``y`` (per group, in the label's units).
    """
    lik = likelihoods.get(tasks.likelihood)
    out = {}
    for s, (pred, sd) in fit_predict(model, tasks, seed).items():
        split = tasks.split(s)
        mean = lik.mean_label(pred, tasks.y_mean, tasks.y_sd) if lik.standardise_labels else pred
        draws, noise, ys = [], [], []
        for g in range(tasks.n_groups):
            rows = split.rows(g)
            draws.append(mean[rows][None, None, :])
            if sd is not None:
                # one noise sd per group (pooled models: the same for every group)
                noise.append(np.full((1, 1), (sd[rows][0] if rows.size else 1.0) * tasks.y_sd))
            ys.append(lik.mean_label(split.y[rows], tasks.y_mean, tasks.y_sd))
        out[s] = {"draws": draws, "noise": noise if sd is not None else None, "y": ys}
    return out


def baseline_seed(params: Params) -> int:
    """``gradient_boosting``'s ``random_state``, derived from ``baselines.seed``.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings.

    Returns
    -------
    int
        A seed below ``2**31`` (scikit-learn's range).
    """
    return derive_seed(params.baselines.seed, STAGE_KEYS["baselines"]) % 2**31


def all_predictions(tasks: Tasks, params: Params) -> dict[str, dict[str, dict[str, list]]]:
    """:func:`predictions` of every model in :data:`MODELS`.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The tasks.
    params : hbnn.config.Params
        The run's settings (for the seed).

    Returns
    -------
    dict of str to dict
        ``{model: predictions(model, ...)}``.
    """
    return {m: predictions(m, tasks, baseline_seed(params)) for m in MODELS}


def score_models(tasks: Tasks, preds: dict[str, dict[str, dict[str, list]]]) -> dict:
    """Detail metrics of :func:`all_predictions`, as the BNNs' detail files hold them.

    Parameters
    ----------
    tasks : hbnn.data.tasks.Tasks
        The tasks (for the likelihood and the group names).
    preds : dict of str to dict
        :func:`all_predictions`' output.

    Returns
    -------
    dict
        Per model: pooled ``train`` and ``test`` scores and ``per_group.<g>.{train,test}``.
    """
    lik = scoring_likelihood(tasks.likelihood)
    out: dict = {}
    for model, pred in preds.items():
        m: dict = {"per_group": {name: {} for name in tasks.group_names}}
        for split, p in pred.items():
            m[split], per_group = split_scores(lik, p)
            for g, name in enumerate(tasks.group_names):
                if per_group[g] is not None:
                    m["per_group"][name][split] = per_group[g]
        out[model] = m
    return out


def headline(detail: dict, score: str) -> dict:
    """What ``metrics/baselines.json`` holds per model.

    Parameters
    ----------
    detail : dict
        :func:`score_models`' output (other keys, such as ``made_by``, are left out).
    score : str
        The likelihood's headline score name.

    Returns
    -------
    dict
        Per model: the training rows' ``score`` and every test score, in the shape of the BNNs' headline files
        (:func:`hbnn.diagnostics.evaluation.headline`).
    """
    return {model: {"train": {score: m["train"][score]}, "test": {k: v for k, v in m["test"].items() if k != "n"}}
            for model, m in detail.items() if model in MODELS}


def baselines(params: Params, tasks_path: Path, metrics_out: Path) -> dict:
    """Stage body: fit and score every baseline; write ``metrics_out`` and its detail file together.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings.
    tasks_path : pathlib.Path
        The tasks file (``data/tasks.nc``).
    metrics_out : pathlib.Path
        The headline metrics file; the detail file goes to :func:`hbnn.files.outputs.detail_path` of it.

    Returns
    -------
    dict
        The detail metrics (:func:`score_models` plus ``made_by``).

    Raises
    ------
    hbnn.errors.InputError
        If the tasks file is missing, unreadable or made with other settings.
    """
    tasks = load_run_tasks(tasks_path, params)
    lik = scoring_likelihood(tasks.likelihood)
    detail = score_models(tasks, all_predictions(tasks, params))
    for model in MODELS:
        log.info("baselines: %s test %s %.4f", model, lik.score, detail[model]["test"][lik.score])
    detail["made_by"] = made_by("baselines", params)
    with staged_outputs() as outputs:
        outputs.write_json(as_builtin(detail), detail_path(metrics_out))
        outputs.write_json(as_builtin(headline(detail, lik.score)), metrics_out)
    return detail
