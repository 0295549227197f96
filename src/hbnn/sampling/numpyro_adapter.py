"""Everything of hbnn's that touches NumPyro's internals: :func:`numpyro_patched`, which swaps NumPyro's ``MCMC``
and ``NUTS`` classes and its progress bar while PyMC's JAX bridge runs them, so that a log counts iterations and
divergences as they happen and a run whose draws miss the convergence bar goes on from where it stopped.

Those classes' internals (``MCMC._states``, ``last_state``, ``post_warmup_state``, the progress-bar factory) change
between NumPyro releases, so the patch is tested against the releases in :data:`SUPPORTED` and refused outside them
with one error naming the installed and the supported versions (:func:`check_version`).
"""

from __future__ import annotations

import contextlib
import re
import threading
from importlib import metadata

import numpy as np

from hbnn.errors import InputError
from hbnn.sampling.backend import Iterations

# The NumPyro releases this patch is tested against (requirements-jax.lock pins 0.22.0): [lowest, first refused)
SUPPORTED = ((0, 22, 0), (0, 23, 0))


def check_version() -> None:
    """Refuse a NumPyro outside :data:`SUPPORTED`, before anything is built.

    A missing NumPyro passes: that is the backend's own error (it needs the JAX extra).

    Raises
    ------
    hbnn.errors.InputError
        Where the installed NumPyro is outside :data:`SUPPORTED`; the message names both versions.
    """
    try:
        found = metadata.version("numpyro")
    except metadata.PackageNotFoundError:
        return
    parts = tuple(int(p) for p in re.findall(r"\d+", found)[:3])
    low, high = SUPPORTED
    if not low <= parts < high:
        raise InputError(f"numpyro {found} is installed, but hbnn supports numpyro >={'.'.join(map(str, low))},"
                         f"<{'.'.join(map(str, high))} (it patches NumPyro's MCMC and NUTS classes, whose internals "
                         "change between releases); install the pinned version (make jax, from "
                         "requirements-jax.lock)")


@contextlib.contextmanager
def numpyro_patched(count: bool, extend=None):
    """NumPyro's ``MCMC``, as PyMC's bridge runs it, changed in two ways while the context lasts.

    Parameters
    ----------
    count : bool
        Count the progress-bar updates instead of drawing them (``numpyro.util.progress_bar_factory`` makes one
        ``tqdm_auto`` bar per chain and updates it from a host callback every few iterations), and have every draw
        after tuning report whether it diverged (a host callback from NUTS's sample step), so the heartbeat shows
        divergences as they happen.
    extend : callable, optional
        ``extend(states)``: after the run, while it says so, the chains go on from their last state for another
        ``num_samples`` draws (no warmup), NumPyro's own recipe for more draws (``post_warmup_state =
        last_state``), and every block is kept.

    Yields
    ------
    hbnn.sampling.backend.Iterations or None
        The counts (``None`` without ``count``).

    Raises
    ------
    hbnn.errors.InputError
        Where the installed NumPyro is outside :data:`SUPPORTED`.
    """
    check_version()
    import jax
    import numpyro.infer
    import numpyro.util

    iterations = Iterations() if count else None
    lock = threading.Lock()

    def diverged(flag) -> None:  # called from NumPyro's compiled loop, one thread per chain
        with lock:
            iterations.divergences += int(flag)

    class CountedNUTS(numpyro.infer.NUTS):
        def init(self, rng_key, num_warmup, *args, **kwargs):
            self.tuning = num_warmup  # iterations with state.i below this are tuning (also on going on)
            return super().init(rng_key, num_warmup, *args, **kwargs)

        def sample(self, state, model_args, model_kwargs):
            new = super().sample(state, model_args, model_kwargs)
            jax.debug.callback(diverged, new.diverging & (state.i >= self.tuning))
            return new

    class Recorder:
        def __init__(self, iterable, **_):
            iterations.total += len(iterable)

        def set_description(self, *args, **kwargs) -> None:
            pass

        def update(self, n: int) -> None:
            iterations.add(int(n))

        def close(self) -> None:
            pass

    class Patched(numpyro.infer.MCMC):
        def __init__(self, *args, progress_bar: bool = True, **kwargs):
            super().__init__(*args, progress_bar=progress_bar, **kwargs)
            # NumPyro turns its progress callbacks off where ``CI`` is set (CI services, `dvc repro` in a
            # pipeline): exactly the logs the heartbeat is for. Keep them on; they are counted, never drawn.
            if count and self.chain_method == "parallel":
                self.progress_bar = progress_bar

        def run(self, rng_key, *args, **kwargs):
            super().run(rng_key, *args, **kwargs)
            if extend is None:
                return
            states = jax.device_get(self._states)
            while extend(states):
                self.post_warmup_state = self.last_state
                super().run(self.post_warmup_state.rng_key, *args, **kwargs)
                states = jax.tree.map(lambda a, b: np.concatenate([a, b], axis=1), states,
                                      jax.device_get(self._states))
            self._states, self._states_flat = states, None

    real = numpyro.util.tqdm_auto, numpyro.infer.MCMC, numpyro.infer.NUTS
    if count:
        numpyro.util.tqdm_auto, numpyro.infer.NUTS = Recorder, CountedNUTS
        iterations.divergences = 0
    numpyro.infer.MCMC = Patched
    try:
        yield iterations
    finally:
        numpyro.util.tqdm_auto, numpyro.infer.MCMC, numpyro.infer.NUTS = real
