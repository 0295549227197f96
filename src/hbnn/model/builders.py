"""PyMC model builders: flat, hierarchical (non-centred) and informed-prior BNNs.

All three share :func:`~hbnn.model.network.mlp_logit` and the layer layout from
:func:`~hbnn.model.network.layer_specs`;
they differ only in how each layer's weights are drawn. Builders return a
``pm.Model`` and never sample.

Layer naming follows the maths: ``w_in`` maps features to the first hidden
layer, ``w_h1_h2`` hidden layer 1 to 2 (and so on), ``w_out`` the last hidden
layer to the output. With no hidden layers ``w_out`` maps the features straight
to the output (a linear model). Hierarchical models add ``mu_<layer>``,
``sd_<layer>`` and ``z_<layer>`` with ``w[g] = mu + sd * z[g]``.

The hidden units' activation is :mod:`hbnn.model.activations`' ``activation``
(``model.activation``). The likelihood of ``y`` given the network output is
:mod:`hbnn.model.likelihoods`' (a logit under ``bernoulli``; a mean under
``gaussian``; a log rate under ``poisson``); a likelihood's extra parameter
(gaussian's noise sd ``sigma ~ HalfNormal(noise_sd)``) is one per group in the
per-group fits and one shared by all groups in the hierarchical model, or there, with ``noise="group"``
(gaussian only), one per group from a learned log-normal
(:meth:`hbnn.model.likelihoods.gaussian.Gaussian.add_group_sigma`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from hbnn.model import activations, likelihoods
from hbnn.model.network import LayerSpec, layer_coords, layer_specs, mlp_logit


def _likelihood(output, y, likelihood: str = "bernoulli", noise_sd: float = 1.0, total_size=None,
                row_group=None) -> None:
    """Add ``y_obs`` given the network ``output``: the term of :mod:`hbnn.model.likelihoods` called ``likelihood``;
    with ``row_group`` (each row's group index) the noise sd is per group (``model.noise: group``)."""
    lik = likelihoods.get(likelihood)
    if row_group is None:
        lik.add_observed(output, y, noise_sd, total_size)
    else:
        lik.add_observed(output, y, noise_sd, total_size, sigma=lik.add_group_sigma(noise_sd, row_group))


def _rows(x, y, minibatch_size: int | None):
    """The rows the likelihood sees: all of them, or a random minibatch of them.

    With a minibatch, rows are drawn with replacement at every evaluation and the
    log-likelihood is scaled by ``n_rows / minibatch_size`` (``n_rows`` is symbolic,
    so refitting on another group's rows needs no recompilation).
    """
    if not minibatch_size:
        return x, y, None
    xb, yb = pm.Minibatch(x, y, batch_size=int(minibatch_size))
    return xb, yb, x.shape[0]


def build_flat_model(
    X: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    hidden_layers: Sequence[int],
    prior_sd: float = 1.0,
    minibatch_size: int | None = None,
    likelihood: str = "bernoulli",
    noise_sd: float = 1.0,
    bias: bool = False,
    activation: str = "tanh",
) -> pm.Model:
    """One group's BNN with iid ``Normal(0, prior_sd)`` weights (and biases, with ``bias``).

    Parameters
    ----------
    X : numpy.ndarray
        The group's inputs, ``(obs, feature)``; ``pm.Data`` named ``x`` so a compiled model can be refit on
        another group's rows.
    y : numpy.ndarray
        The group's targets, ``(obs,)``; ``pm.Data`` named ``y``.
    features : sequence of str
        The feature columns.
    hidden_layers : sequence of int
        Units per hidden layer.
    prior_sd : float, optional
        The weights' prior sd.
    minibatch_size : int or None, optional
        For ADVI only: the likelihood sees random batches of this many rows.
    likelihood : str, optional
        A registered likelihood (:mod:`hbnn.model.likelihoods`).
    noise_sd : float, optional
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter, where it has one.
    bias : bool, optional
        Whether each layer has a bias row.
    activation : str, optional
        A registered activation of the hidden units (:mod:`hbnn.model.activations`).

    Returns
    -------
    pymc.Model
        The model, not sampled.
    """
    specs = layer_specs(len(features), hidden_layers, bias)
    with pm.Model(coords=layer_coords(features, hidden_layers, bias=bias)) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = [pm.Normal(s.var, 0.0, prior_sd, dims=s.dims) for s in specs]
        xb, yb, total = _rows(x, y_data, minibatch_size)
        _likelihood(mlp_logit(xb, weights, activations.get(activation).pytensor, bias), yb, likelihood, noise_sd, total)
    return model


def build_informed_model(
    X: np.ndarray,
    y: np.ndarray,
    features: Sequence[str],
    hidden_layers: Sequence[int],
    prior: Mapping[str, tuple[np.ndarray, np.ndarray]],
    minibatch_size: int | None = None,
    likelihood: str = "bernoulli",
    noise_sd: float = 1.0,
    bias: bool = False,
    activation: str = "tanh",
) -> pm.Model:
    """One group's BNN with a multivariate-normal prior on each flattened layer (biases included, with ``bias``).

    The prior is written non-centred, ``w = mean + chol(cov) @ z`` with ``z ~ N(0, I)``, which is the same
    distribution as ``MvNormal(mean, cov)`` but easier for NUTS. ``mean`` and the Cholesky factor are
    ``pm.Data`` (``prior_mean_<layer>``, ``prior_chol_<layer>``), not constants: the compiled model then
    depends on the prior's shapes only, so a new prior (every change upstream of it) reuses the compile caches
    instead of compiling afresh (benchmarks/FINDINGS.md, "Blocks of 500, a padded kernel, a cached informed
    compile").

    Parameters
    ----------
    X : numpy.ndarray
        The group's inputs, ``(obs, feature)``.
    y : numpy.ndarray
        The group's targets, ``(obs,)``.
    features : sequence of str
        The feature columns.
    hidden_layers : sequence of int
        Units per hidden layer.
    prior : mapping of str to (numpy.ndarray, numpy.ndarray)
        Per layer name, ``(mean, cov)`` with ``mean`` of length ``layer.size`` (row-major flattening of the
        layer's weight matrix).
    minibatch_size : int or None, optional
        For ADVI only: the likelihood sees random batches of this many rows.
    likelihood : str, optional
        A registered likelihood (:mod:`hbnn.model.likelihoods`).
    noise_sd : float, optional
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter, where it has one.
    bias : bool, optional
        Whether each layer has a bias row.
    activation : str, optional
        A registered activation of the hidden units (:mod:`hbnn.model.activations`).

    Returns
    -------
    pymc.Model
        The model, not sampled.
    """
    specs = layer_specs(len(features), hidden_layers, bias)
    coords = layer_coords(features, hidden_layers, bias=bias)
    for s in specs:
        coords[f"weight_{s.name}"] = list(range(s.size))
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = []
        for s in specs:
            mean, cov = prior[s.name]
            # Static shapes: without them PyTensor checks at run time that the two lengths agree, with an
            # equality whose operand order varies from process to process, and so does the graph's cache key.
            mean = pt.specify_shape(pm.Data(f"prior_mean_{s.name}", np.asarray(mean, dtype=np.float64)), (s.size,))
            chol = pt.specify_shape(pm.Data(f"prior_chol_{s.name}", np.linalg.cholesky(cov)), (s.size, s.size))
            z = pm.Normal(f"z_{s.name}", 0.0, 1.0, dims=f"weight_{s.name}")
            flat = mean + chol @ z
            weights.append(pm.Deterministic(s.var, flat.reshape(s.shape), dims=s.dims))
        xb, yb, total = _rows(x, y_data, minibatch_size)
        _likelihood(mlp_logit(xb, weights, activations.get(activation).pytensor, bias), yb, likelihood, noise_sd, total)
    return model


def build_hierarchical_model(
    X_padded: np.ndarray,
    y: np.ndarray,
    valid: np.ndarray,
    group_names: Sequence[str],
    features: Sequence[str],
    hidden_layers: Sequence[int],
    likelihood: str = "bernoulli",
    noise_sd: float = 1.0,
    bias: bool = False,
    activation: str = "tanh",
    noise: str = "shared",
) -> pm.Model:
    """Non-centred hierarchical BNN over all groups (biases, with ``bias``, are part of each layer).

    Per layer: ``mu ~ N(0, 1)`` per weight, ``sd ~ HalfNormal(1)``, ``z[g] ~ N(0, 1)`` and
    ``w[g] = mu + sd * z[g]``. Only the real rows enter the likelihood, so padding rows contribute nothing.

    Parameters
    ----------
    X_padded : numpy.ndarray
        The inputs, ``(group, row, feature)`` (see :class:`hbnn.data.tasks.Padded`).
    y : numpy.ndarray
        The real rows' targets, in the order of ``valid``.
    valid : numpy.ndarray
        The flattened ``group*row`` positions of the real rows.
    group_names : sequence of str
        The groups, in the order of ``X_padded``.
    features : sequence of str
        The feature columns.
    hidden_layers : sequence of int
        Units per hidden layer.
    likelihood : str, optional
        A registered likelihood (:mod:`hbnn.model.likelihoods`).
    noise_sd : float, optional
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter, where it has one.
    bias : bool, optional
        Whether each layer has a bias row.
    activation : str, optional
        A registered activation of the hidden units (:mod:`hbnn.model.activations`).
    noise : str, optional
        ``shared``: one noise sd for all groups; ``group``: one per group (gaussian only, ``model.noise``).

    Returns
    -------
    pymc.Model
        The model, not sampled.
    """
    specs = layer_specs(len(features), hidden_layers, bias)
    coords = layer_coords(features, hidden_layers, group_names, bias)
    row_group = np.asarray(valid) // X_padded.shape[1] if noise == "group" else None
    ragged = valid.size != X_padded.shape[0] * X_padded.shape[1]
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X_padded, dims=("group", "row", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        weights = _group_weights(specs)
        logit = mlp_logit(x, weights, activations.get(activation).pytensor, bias).reshape((-1,))
        if ragged:
            logit = logit[pt.as_tensor(valid)]
        _likelihood(logit, y_data, likelihood, noise_sd, row_group=row_group)
    return model


def _group_weights(specs: Sequence[LayerSpec]) -> list:
    """Per layer ``mu ~ N(0, 1)``, ``sd ~ HalfNormal(1)``, ``z[g] ~ N(0, 1)``, ``w[g] = mu + sd * z[g]``."""
    weights = []
    for s in specs:
        mu = pm.Normal(f"mu_{s.name}", 0.0, 1.0, dims=s.dims)
        sd = pm.HalfNormal(f"sd_{s.name}", 1.0)
        z = pm.Normal(f"z_{s.name}", 0.0, 1.0, dims=("group", *s.dims))
        weights.append(pm.Deterministic(s.var, mu + sd * z, dims=("group", *s.dims)))
    return weights


def build_hierarchical_minibatch_model(
    X: np.ndarray,
    group: np.ndarray,
    y: np.ndarray,
    group_names: Sequence[str],
    features: Sequence[str],
    hidden_layers: Sequence[int],
    minibatch_size: int,
    likelihood: str = "bernoulli",
    noise_sd: float = 1.0,
    bias: bool = False,
    activation: str = "tanh",
    noise: str = "shared",
) -> pm.Model:
    """The hierarchical BNN of :func:`build_hierarchical_model` for minibatch ADVI.

    Same priors and variables, but in the long layout. Each evaluation draws ``minibatch_size`` rows with
    replacement, gathers each row's group weights and scales the log-likelihood by ``n_rows / minibatch_size``.
    Only real rows exist, so there is nothing to pad.

    Parameters
    ----------
    X : numpy.ndarray
        All groups' inputs, ``(obs, feature)``.
    group : numpy.ndarray
        Each row's integer group code, ``(obs,)``.
    y : numpy.ndarray
        The targets, ``(obs,)``.
    group_names : sequence of str
        The groups, in the order of the codes.
    features : sequence of str
        The feature columns.
    hidden_layers : sequence of int
        Units per hidden layer.
    minibatch_size : int
        Rows per evaluation.
    likelihood : str, optional
        A registered likelihood (:mod:`hbnn.model.likelihoods`).
    noise_sd : float, optional
        Scale of the ``HalfNormal`` prior of the likelihood's extra parameter, where it has one.
    bias : bool, optional
        Whether each layer has a bias row.
    activation : str, optional
        A registered activation of the hidden units (:mod:`hbnn.model.activations`).
    noise : str, optional
        As :func:`build_hierarchical_model`'s.

    Returns
    -------
    pymc.Model
        The model, not sampled.
    """
    specs = layer_specs(len(features), hidden_layers, bias)
    coords = layer_coords(features, hidden_layers, group_names, bias)
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        g = pm.Data("g", np.asarray(group, dtype=np.int64), dims="obs")
        y_data = pm.Data("y", y, dims="obs")
        weights = _group_weights(specs)
        xb, gb, yb = pm.Minibatch(x, g, y_data, batch_size=int(minibatch_size))
        # One row per batch element, each with its group's weights: (batch, 1, feature).
        logit = mlp_logit(xb[:, None, :], [w[gb] for w in weights], activations.get(activation).pytensor, bias)[:, 0]
        _likelihood(logit, yb, likelihood, noise_sd, x.shape[0], row_group=gb if noise == "group" else None)
    return model
