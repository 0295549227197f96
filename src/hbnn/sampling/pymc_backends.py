"""PyMC's own NUTS and NumPyro's and BlackJAX's through PyMC's JAX bridge."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hbnn import logs
from hbnn.config import ConfigError, SamplerParams
from hbnn.sampling.backend import Backend, _leapfrog_steps
from hbnn.sampling.numpyro_adapter import check_version, numpyro_patched
from hbnn.sampling.runlength import _next_check, look_unit

if TYPE_CHECKING:
    import pymc as pm

log = logging.getLogger(__name__)


def _require_jax(backend: str) -> None:
    """Fail before any sampling, naming the param, when the JAX extra is missing."""
    missing = [m for m in ("jax", backend) if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"invalid parameter sampler.backend={backend!r}: needs the JAX extra ({', '.join(missing)} not "
            "installed); run `make jax` (pins in requirements-jax.lock)"
        )


def _use_host_devices(n: int) -> None:
    """Let JAX see ``n`` CPU devices so chains can run in parallel (before JAX starts)."""
    flag = f"--xla_force_host_platform_device_count={n}"
    current = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in current:
        os.environ["XLA_FLAGS"] = f"{current} {flag}".strip()


class PymcBackend(Backend):
    """PyMC's own NUTS through ``pm.sample``, which compiles on every call.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it.
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    density : hbnn.density.densities.Density, optional
        Not used: this backend samples PyMC's compiled density.
    """

    name = "pymc"
    compiles_in_sampling = True

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        super().__init__(model, settings, density, full_batch)
        self.model  # noqa: B018 - built now, not inside the first fit's sampling seconds

    def _sample_kwargs(self) -> dict:
        # keep the tuning steps to count gradient evaluations
        return {"discard_tuned_samples": False, "mp_ctx": _chain_process_context()}

    def run(self, seed, data, progressbar: bool | None = None):
        """Sample with ``pm.sample`` (the tuning draws kept, to count gradient evaluations).

        Parameters
        ----------
        seed : int
        data : mapping of str to numpy.ndarray or None
            New values of the model's ``pm.Data`` containers.
        progressbar : bool, optional
            PyMC's progress bar (``None``: where standard error is a terminal).

        Returns
        -------
        hbnn.files.trace.Trace
            ``posterior`` and ``sample_stats`` (or ArviZ's ``InferenceData`` with them).
        numpy.ndarray or None
            The ADVI loss, ``None`` for NUTS.
        int or None
            The gradient evaluations made, ``None`` where the backend cannot tell.
        """
        import pymc as pm

        s = self.settings
        self._set_data(data)
        with self.model:
            idata = pm.sample(
                draws=s.draws,
                tune=s.tune,
                chains=s.chains,
                cores=min(s.cores, s.chains),
                random_seed=seed,
                target_accept=s.target_accept,
                progressbar=logs.interactive() if progressbar is None else progressbar,
                compute_convergence_checks=False,
                nuts_sampler=self.name,
                **self._sample_kwargs(),
            )
        return idata, None, self._grad_evals(idata)

    def _grad_evals(self, idata) -> int | None:
        return _leapfrog_steps(idata, "warmup_sample_stats", "sample_stats")


def _chain_process_context() -> str | None:
    """How PyMC starts its chain processes: its default (fork on Linux) unless JAX is loaded.

    JAX runs threads from import on; a forked child of a multithreaded process can deadlock
    (JAX warns so at every fork). A process that has used a JAX backend and then samples with
    PyMC's NUTS (library use, the test suite) starts its chains from a forkserver instead.
    """
    return "forkserver" if "jax" in sys.modules else None


class JaxBackend(PymcBackend):
    """NumPyro's or BlackJAX's NUTS through PyMC's JAX bridge (the JAX extra: ``make jax``).

    The bridge traces and jits on every call and does not report tuning steps,
    so gradient evaluations are unknown (``None``).

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it.
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    density : hbnn.density.densities.Density, optional
        Not used: this backend samples PyMC's compiled density.

    Raises
    ------
    hbnn.errors.InputError
        Where the JAX extra is not installed.
    """

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        _require_jax(self.name)
        super().__init__(model, settings, density, full_batch)
        _use_host_devices(max(settings.cores, 1))

    def _sample_kwargs(self) -> dict:
        s = self.settings
        return {"discard_tuned_samples": True,
                "nuts_sampler_kwargs": {"chain_method": "parallel" if s.chains <= s.cores else "sequential"}}

    def _grad_evals(self, idata) -> int | None:
        return None


class NumpyroBackend(JaxBackend):
    """NumPyro's NUTS. In a log, its progress callbacks are recorded (not drawn) for the heartbeat.

    With ``max_draws`` and a :attr:`~hbnn.sampling.backend.Backend.until` check, a run whose draws miss the bar
    (defined in :mod:`hbnn.diagnostics.criterion`) at a look (defined in :mod:`hbnn.sampling.runlength`) goes on
    from where it stopped (no new warmup: the adapted step size and mass matrix are kept) in blocks of ``draws`` per
    chain, up to ``max_draws``; the trace holds every block.

    Parameters
    ----------
    model : pymc.Model or callable
        The PyMC model, or a function that builds it.
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    density : hbnn.density.densities.Density, optional
        Not used: this backend samples PyMC's compiled density.

    Raises
    ------
    hbnn.errors.InputError
        Where the JAX extra is not installed, or the installed NumPyro is outside
        :data:`hbnn.sampling.numpyro_adapter.SUPPORTED`.
    """

    name = "numpyro"

    def __init__(self, model: pm.Model | Callable[[], pm.Model], settings: SamplerParams, density=None,
                 full_batch: Callable[[], pm.Model] | None = None):
        check_version()  # before the model is built or traced: the patch below needs a supported NumPyro
        super().__init__(model, settings, density, full_batch)

    def run(self, seed, data, progressbar=None):
        """Sample with NumPyro through ``pm.sample``, counting iterations for the heartbeat with parallel chains.

        Parameters
        ----------
        seed : int
        data : mapping of str to numpy.ndarray or None
            New values of the model's ``pm.Data`` containers.
        progressbar : bool, optional
            PyMC's progress bar (``None``: where standard error is a terminal).

        Returns
        -------
        hbnn.files.trace.Trace
            ``posterior`` and ``sample_stats`` (or ArviZ's ``InferenceData`` with them).
        numpy.ndarray or None
            The ADVI loss, ``None`` for NUTS.
        int or None
            The gradient evaluations made, ``None`` where the backend cannot tell.
        """
        # NumPyro reports progress from inside its compiled loop only when the chains run in parallel;
        # sequential chains with a progress bar fall back to a Python loop, one dispatch per step.
        count = not logs.interactive() and self._sample_kwargs()["nuts_sampler_kwargs"]["chain_method"] == "parallel"
        extend = self._extension() if self.settings.max_draws > self.settings.draws and self.until else None
        if not count and extend is None:
            return super().run(seed, data, progressbar)
        with numpyro_patched(count, extend) as self.iterations:
            try:
                return super().run(seed, data, progressbar=True if count else progressbar)
            finally:
                self.iterations = None

    def _extension(self):
        """``more(states)``: whether to draw another block, given NumPyro's states so far (chain, draw, ...)."""
        import arviz
        import jax
        from pymc.backends.arviz import coords_and_dims_for_inferencedata
        from pymc.sampling.jax import get_jaxified_graph
        from pymc.util import get_default_varnames

        s, model, until = self.settings, self.model, self.until
        outputs = list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))
        constrain = jax.jit(jax.vmap(jax.vmap(get_jaxified_graph(inputs=model.value_vars, outputs=outputs))))
        coords, dims = coords_and_dims_for_inferencedata(model)

        def more(states: dict) -> bool:
            drawn = states["diverging"].shape[1]
            values = constrain(*states["z"])
            posterior = arviz.dict_to_dataset({v.name: np.asarray(x) for v, x in zip(outputs, values, strict=True)},
                                           coords=coords, dims=dims, library=None)
            return _next_check(until(posterior), drawn, s, look_unit(s.backend, s.draws)) is not None

        return more


class BlackjaxBackend(JaxBackend):
    """BlackJAX's NUTS through PyMC's JAX bridge; parameters as :class:`JaxBackend`'s."""

    name = "blackjax"
