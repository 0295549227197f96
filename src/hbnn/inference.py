"""Turn (model, sampler settings, seed) into ``InferenceData``, whatever the backend.

:class:`Sampler` compiles a model once; :meth:`Sampler.sample` can then be called
repeatedly, optionally with new values for the model's ``pm.Data`` containers
(another group's rows), without recompiling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import arviz as az
import numpy as np
import pymc as pm

from hbnn.config import SamplerParams

log = logging.getLogger(__name__)


def derive_seed(base: int, *keys: int) -> int:
    """A 32-bit seed derived from ``base`` and integer ``keys`` (stage, group, ...).

    Uses ``SeedSequence`` so nearby keys give unrelated streams.
    """
    return int(np.random.SeedSequence(base, spawn_key=keys).generate_state(1)[0])


@dataclass
class Fit:
    """Posterior draws and sampler statistics of one sampling run."""

    posterior: az.InferenceData  # groups: posterior, sample_stats
    seconds: float


class Sampler:
    """A model compiled once for the configured backend."""

    def __init__(self, model: pm.Model, settings: SamplerParams):
        self.model = model
        self.settings = settings
        start = time.perf_counter()
        if settings.backend == "nutpie":
            import nutpie

            self._compiled = nutpie.compile_pymc_model(model, backend="numba")
        else:
            self._compiled = None
        self.compile_seconds = time.perf_counter() - start

    def sample(self, seed: int, data: Mapping[str, np.ndarray] | None = None) -> Fit:
        """Run NUTS with the configured settings; ``data`` replaces ``pm.Data`` values."""
        s = self.settings
        log.info("sampling: backend=%s chains=%d tune=%d draws=%d seed=%d", s.backend, s.chains, s.tune, s.draws, seed)
        start = time.perf_counter()
        if s.backend == "nutpie":
            import nutpie

            compiled = self._compiled.with_data(**data) if data else self._compiled
            idata = nutpie.sample(
                compiled,
                draws=s.draws,
                tune=s.tune,
                chains=s.chains,
                cores=s.cores,
                seed=seed,
                target_accept=s.target_accept,
                progress_bar=False,
                save_warmup=False,
            )
        else:
            with self.model:
                if data:
                    pm.set_data(dict(data))
                idata = pm.sample(
                    draws=s.draws,
                    tune=s.tune,
                    chains=s.chains,
                    cores=min(s.cores, s.chains),
                    random_seed=seed,
                    target_accept=s.target_accept,
                    progressbar=False,
                    compute_convergence_checks=False,
                )
        seconds = time.perf_counter() - start
        idata = az.InferenceData(posterior=idata.posterior, sample_stats=idata.sample_stats)
        return Fit(posterior=idata, seconds=seconds)
