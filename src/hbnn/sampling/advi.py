"""Mean-field ADVI, with its optimisation step compiled once and reused across fits."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from hbnn.config import SamplerParams
from hbnn.sampling.advi_common import advi_trace, check_loss, keep_best, split_seed
from hbnn.sampling.backend import Backend, Iterations

if TYPE_CHECKING:
    import pymc as pm

log = logging.getLogger(__name__)


class AdviBackend(Backend):
    """Mean-field ADVI (:class:`_Advi`), then ``chains x draws`` draws from the approximation.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it.
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    density : hbnn.density.densities.Density, optional
        The model's hand-written log density of the full batch: the fit fits it
        (:class:`hbnn.sampling.density_advi.DensityAdvi`, the same approximation over the same coordinates, its
        minibatches drawn as PyMC draws them, without PyTensor) once it is checked against PyMC's full-batch model;
        a fit whose density fails the check, or a minibatch fit with no ``full_batch`` to check it against, fits
        PyMC's model (:class:`_Advi`).
    full_batch : callable, optional
        Builds PyMC's full-batch model where ``model`` is a minibatch one (``advi.minibatch_size`` > 0).
    """

    name = "advi"
    density_advi = None  # the hand-written density's ADVI, where it is fitted instead of PyMC's model

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        super().__init__(model, settings, density, full_batch)
        batch = settings.advi.minibatch_size
        if density is not None and (not batch or full_batch is not None):
            from hbnn.density.pymc_check import DensityMismatch

            try:
                density.checked_nutpie_model(self.full_batch_model)
            except DensityMismatch as err:  # not the model's density: PyTensor's is the same model, only slower
                log.warning("fitting PyTensor's log density by ADVI, not the hand-written one: %s", err)
            else:
                from hbnn.sampling.density_advi import DensityAdvi

                self.density_advi = DensityAdvi(density, batch)
                return
        self.advi = _Advi(self.model, settings.advi.learning_rate)

    @staticmethod
    def minibatch_size(settings: SamplerParams) -> int | None:
        """Return ``advi.minibatch_size``, ``None`` where it is 0 (full batch).

        Parameters
        ----------
        settings : hbnn.config.SamplerParams

        Returns
        -------
        int or None
        """
        return settings.advi.minibatch_size or None

    @staticmethod
    def parallel_chains(settings: SamplerParams) -> int:
        """Return 1: ADVI fits one approximation, whatever ``chains``.

        Parameters
        ----------
        settings : hbnn.config.SamplerParams

        Returns
        -------
        int
        """
        return 1

    def label(self) -> str:
        """Return what runs, for log lines: ADVI's iterations and minibatch size."""
        a = self.settings.advi
        starts = f" starts={a.starts}" if a.starts > 1 else ""
        return f"fitting: backend=advi iterations={a.iterations} minibatch={a.minibatch_size}{starts}"

    def run(self, seed, data):
        """Fit the approximation from ``seed`` and draw ``chains x draws`` from it.

        Parameters
        ----------
        seed : int
        data : mapping of str to numpy.ndarray or None
            New values of the model's ``pm.Data`` containers.

        Returns
        -------
        hbnn.files.trace.Trace
            ``posterior`` and ``sample_stats`` (or ArviZ's ``InferenceData`` with them).
        numpy.ndarray or None
            The ADVI loss, ``None`` for NUTS.
        int or None
            The gradient evaluations made, ``None`` where the backend cannot tell.
        """
        a = self.settings.advi
        self.iterations = Iterations(a.iterations * a.starts, "ADVI iterations")
        try:
            if self.density_advi is None:
                self._set_data(data)
                fit = self.advi.fit
            else:
                fitted = self.density_advi
                if data:
                    if set(data) != {"x", "y"}:
                        raise ValueError(f"the hand-written log density takes new rows as x and y, not {sorted(data)}")
                    fitted = fitted.with_rows(data["x"], data["y"])
                fit = fitted.fit
            posterior, loss = keep_best(lambda start: fit(start, self.settings, self.iterations), seed, a.starts)
        finally:
            self.iterations = None
        return advi_trace(posterior, loss, self.settings), loss, None


class _Advi:
    """Mean-field ADVI whose optimisation step is compiled once and reused.

    Every :meth:`fit` restores the approximation's and the optimiser's starting
    state, reseeds every random stream (Monte Carlo ELBO draws, minibatch indices)
    and runs ``iterations`` Adam steps, so fits do not depend on earlier fits.
    The approximation's means start at the model's initial point plus
    ``N(0, init_jitter)`` noise: at all-zero weights a tanh network sits on a
    saddle where every hidden unit looks alike, and ADVI started there stays
    near it, with a far lower test accuracy (measured: benchmarks/FINDINGS.md, section 'Measurements behind code
    comments').
    """

    def __init__(self, model: pm.Model, learning_rate: float):
        import pymc as pm
        from pytensor.tensor.random.type import RandomType

        self.model = model
        with model:
            self.inference = pm.ADVI()
            self.step = self.inference.objective.step_function(
                obj_optimizer=pm.adam(learning_rate=learning_rate), score=True
            )
        data = {id(v) for v in model.data_vars}
        self.state = [v for v in self.step.get_shared() if id(v) not in data]
        self.initial = [copy.deepcopy(v.get_value(borrow=False)) for v in self.state]
        self.rngs = [v for v in self.state if isinstance(v.type, RandomType)]
        (group,) = self.inference.approx.groups
        self.mean = group.params_dict["mu"]
        self.mean_start = self.mean.get_value(borrow=False).copy()

    def fit(self, seed: int, s: SamplerParams, progress: Iterations | None = None
            ) -> tuple[xr.Dataset, np.ndarray]:
        """Fit from the starting state with ``seed`` and draw from the approximation.

        Parameters
        ----------
        seed : int
            Seeds the ELBO's and the minibatches' streams, the starting jitter and the draws.
        s : hbnn.config.SamplerParams
            ``advi.*``, ``chains`` and ``draws``.
        progress : hbnn.sampling.backend.Iterations, optional
            Counts the steps, for the heartbeat.

        Returns
        -------
        tuple
            ``(posterior, loss)``: ``chains x draws`` draws, and the loss per step (:func:`advi_trace` makes the
            trace).

        Raises
        ------
        FloatingPointError
            If the loss becomes non-finite (a learning rate too high).
        """
        from pymc.pytensorf import reseed_rngs

        for var, value in zip(self.state, self.initial, strict=True):
            var.set_value(copy.deepcopy(value))
        fit_seed, draw_seed, init_seed = split_seed(seed)
        reseed_rngs(self.rngs, fit_seed)
        jitter = np.random.default_rng(init_seed).normal(0.0, s.advi.init_jitter, self.mean_start.shape)
        self.mean.set_value(self.mean_start + jitter)
        loss = np.empty(s.advi.iterations)
        for i in range(s.advi.iterations):
            loss[i] = self.step()
            if progress is not None:
                progress.add(1)
        check_loss(loss, s.advi.learning_rate)
        with self.model:
            draws = self.inference.approx.sample(s.chains * s.draws, random_seed=draw_seed,
                                                 return_inferencedata=True)
        return _as_chains(draws.posterior, s.chains, s.draws), loss


def _as_chains(posterior: xr.Dataset, chains: int, draws: int) -> xr.Dataset:
    """Split one chain of ``chains * draws`` independent draws into ``(chain, draw)``."""
    out = {}
    for name, da in posterior.data_vars.items():
        da = da.isel(chain=0, drop=True)
        values = da.values.reshape(chains, draws, *da.shape[1:])
        dims = ("chain", "draw", *da.dims[1:])
        coords = {d: da.coords[d] for d in da.dims[1:] if d in da.coords}
        out[name] = xr.DataArray(values, dims=dims, coords=coords)
    return xr.Dataset(out, coords={"chain": np.arange(chains), "draw": np.arange(draws)})
