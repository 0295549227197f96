"""Cost estimates that stop a run too large for this machine before it starts.

Before generating data or sampling, each stage estimates its peak memory and wall-clock time from its sizes, logs
it, and refuses with a :class:`~hbnn.config.ConfigError` where the typical cost exceeds ``limits.max_memory_gib`` /
``limits.max_minutes``. A fit that can run longer than typical (drawn on to ``max_draws``, fitted again, restarted)
also logs the most it can take, and warns where that much memory is past the limit. The limits are guards, not
inputs to any result: no stage lists them as a DVC param.

The model of the cost:

- a NUTS gradient costs ``GRAD_OVERHEAD_US`` plus ``NS_PER_ROW_WEIGHT`` per (training row x weight) (nutpie's
  hand-written density, :mod:`hbnn.density.kernel`: the ``KERNEL_`` pair), plus ``NS_PER_PRIOR_ENTRY`` per entry of
  each informed-prior covariance, plus ``NS_PER_DIM`` per sampled coordinate;
- a NUTS iteration takes ``STEPS_PER_ITERATION[backend]`` gradients (as each backend adapts on the default
  hierarchical fit), more with the square root of the coordinates, up to the tree-depth cap of 1023; nutpie with
  Stan's mass matrix typically ``STEPS_DIAG_STAN``, growing as measured (``STEPS_GROWTH``), and the cap at most;
- a fit drawn on past ``draws`` typically stops at ``EXPECTED_DRAW_FACTOR`` times ``draws`` (at most ``max_draws``);
- an ADVI step costs ``ADVI_STEP_US`` plus ``NS_PER_ROW_WEIGHT`` per (batch row x weight) plus
  ``NS_PER_ADVI_PARAM`` per model parameter (each step updates every parameter's mean and sd, whatever the batch);
  over the hand-written density (full batch, and the hierarchical fit's minibatches), ``DENSITY_ADVI_STEP_US`` plus
  ``KERNEL_NS_PER_ROW_WEIGHT`` per (batch row x weight) plus ``NS_PER_DENSITY_ADVI_PARAM`` per parameter, plus
  ``NS_PER_MINIBATCH_ROW`` per minibatch row;
- a fit's memory is the larger of two phases, over the process and the hierarchical fit's padded layout: while NUTS
  samples, the sampler's batches of every draw, tuning included, ``SAMPLER_COPIES`` times over and each chain's
  trajectory (``NUTS_STATE_VALUES`` per sampled coordinate); once it is over, every kept draw of every value
  ``COPIES`` times over (a hierarchical or informed draw stores each group's ``z`` and its weights), the posterior
  predictions of every row and PSIS-LOO's arrays.

Calibrated against the measured costs of the default pipeline and of `make bench`'s scaling section
(``reports/benchmark.json``; tests/test_budget.py holds the NUTS estimates within 2x of those points). Fits whose
length depends on the data are estimated as they typically run, so a given fit can take up to about twice as long.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass

from hbnn.config import ConfigError, Params
from hbnn.pipeline.variants import FITS, HIERARCHICAL, INFORMED

log = logging.getLogger(__name__)

GRAD_OVERHEAD_US = 20.0
NS_PER_ROW_WEIGHT = 10.0
NS_PER_PRIOR_ENTRY = 1.0
# Leapfrog steps per NUTS iteration, as adapted on the default fits (nutpie: the flat per-group fits, 42 at 18 and at
# 1000 groups). numpyro: scaled so that a fixed-length default hierarchical fit is estimated somewhat high
# (benchmarks/FINDINGS.md, "Measurements behind code comments"); the heartbeat reports the time left from this
# estimate only while NumPyro compiles (its iterations after that).
STEPS_PER_ITERATION = {"nutpie": 48, "pymc": 256, "numpyro": 320, "blackjax": 512}
# An informed prior's fits take this many times the flat fits' steps at the default data (158 against 42: the prior's
# correlations); a tighter prior takes fewer (8 at 1000 groups from an ADVI posterior), where the estimate errs high
INFORMED_STEPS_FACTOR = 3.8
# NUTS' tree-depth cap: the most steps an iteration takes, which nutpie with the Stan-style mass matrix approaches at
# high target_accept (the worst case counts it)
STEPS_PER_ITERATION_DIAG_STAN = 1023
# ... and typically, as measured on the default hierarchical fit (DIMS_MEASURED coordinates), growing with the
# coordinates to this power (the scaling section of reports/benchmark.json: 484, 698, 960 steps at 18, 60, 200 groups)
STEPS_DIAG_STAN = 490
STEPS_GROWTH = 0.28
# A hierarchical fit drawn on past its draws (max_draws) typically stops at about this many times draws: the geometric
# mean over the default pipeline's hierarchical fits and refits, 1.4x to 7.4x (benchmarks/FINDINGS.md)
EXPECTED_DRAW_FACTOR = 3
# nutpie samples the hand-written log density (hbnn.density.kernel, passes written out per network): fitted to the time
# per gradient of the hierarchical fit at 18 to 200 groups of 50 rows x 40 weights and of the default flat (50 x 40)
# fits, sampler overhead and the slower chain's wait included, on the faster of the two CPUs in benchmarks/FINDINGS.md
# (about 1.1 us a group; 1.7 on the slower one, whose rows reports/benchmark.json now holds)
KERNEL_GRAD_OVERHEAD_US = 1.5
# Per sampled coordinate and leapfrog step: the sampler's own vector arithmetic, the priors and the chain rule. With the
# trajectories' growth with the coordinates (the steps above were measured at DIMS_MEASURED, the default hierarchical
# fit's 763), fitted so that a fit of 20,000 groups of 2 rows (800,043 coordinates, 615 s) is not estimated short
# (benchmarks/FINDINGS.md, "Measurements behind code comments")
NS_PER_DIM = 11.0
DIMS_MEASURED = 763
KERNEL_NS_PER_ROW_WEIGHT = 0.4
# ADVI, fitted on 2 cores to flat fits and to the 1000-group hierarchical minibatch fit (40,043 parameters) at two
# batch sizes, which it estimates high (benchmarks/FINDINGS.md, "Measurements behind code comments").
ADVI_STEP_US = 60.0
NS_PER_ADVI_PARAM = 125.0
# ADVI over the hand-written density (hbnn.sampling.density_advi): a step's Python calls, measured on a flat
# fit of 40 parameters (12 us a step, its gradient 2 us); per parameter, the noise, softplus, Adam and the density's
# own per-coordinate work, measured at 1000 groups (40,043 parameters, 50,000 rows: 2.2 ms a step on 2 cores another
# fit was using, the rows' share costed by KERNEL_NS_PER_ROW_WEIGHT) (benchmarks/FINDINGS.md, "Measurements behind
# code comments")
DENSITY_ADVI_STEP_US = 10.0
NS_PER_DENSITY_ADVI_PARAM = 35.0
# ... and per row of a minibatch: its gather and its group's weights, chain rule and padded passes (at 1000 groups most
# groups drawn are drawn once), from the hierarchical fit's steps at 500 and 2,000 rows (0.90 and 1.37 ms)
NS_PER_MINIBATCH_ROW = 310.0
BYTES = 8
COPIES = 4  # a stored draw: the sampler's or the file's arrays, their conversion, xarray's copy, the group stack
# While NUTS samples, nutpie's batches hold every draw, tuning included, this many times over (the batches and the
# draws' buffers the allocator keeps: measured 2.1 to 3.3 over runs of 30 to 3,000 draws), and each chain's trajectory
# keeps this many values per sampled coordinate alive from its first iterations (the states of a tree up to 10 deep:
# positions, momenta, gradients; measured 0.15 GiB a chain at 120,043 coordinates) (benchmarks/FINDINGS.md,
# "Measurements behind code comments")
SAMPLER_COPIES = 3
NUTS_STATE_VALUES = 170
# A fit stage's process before its data (Python, NumPy, PyMC, nutpie, the density checked): benchmarks/memory.py's peak
# with no rows, rounded up (benchmarks/FINDINGS.md, "Measurements behind code comments")
PROCESS_GIB = 0.75
# The padded layout per row: the tasks', density's and PyMC's feature copies, the check's values per unit (activations,
# gradients); above the measured bytes a row (benchmarks/FINDINGS.md, "Measurements behind code comments")
LAYOUT_COPIES = 3
CHECK_VALUES_PER_UNIT = 2
LOO_COPIES = 5  # the training rows' log-likelihood, its ratios for the relative ESS and az.loo's working arrays
MEMORY_FRACTION = 0.8  # limits.max_memory_gib: 0 means this share of the machine's memory
# one row of the tasks file and its copies while it is built; making, scaling and rotating one moons group: both
# rounded up from the measured figures (benchmarks/FINDINGS.md, "Measurements behind code comments")
ROW_BYTES = 400
SECONDS_PER_MOONS_GROUP = 2e-3


@dataclass(frozen=True)
class Estimate:
    """Peak memory (GiB) and wall time (minutes) of one stage, and the sizes behind them."""

    stage: str
    memory_gib: float  # what the stage typically takes
    minutes: float
    sizes: str
    first_minutes: float | None = None  # a fit drawn on past its draws: its time to its first look, else None
    most_minutes: float | None = None  # the most it can take where that is more (max_draws, refits, restarts)
    most_memory_gib: float | None = None

    def describe(self) -> str:
        """Return the estimate as one log line: stage, GiB, minutes (typical, and at most) and sizes."""
        most = [f"{value:.2g} {unit}" for value, unit in ((self.most_memory_gib, "GiB"), (self.most_minutes, "min"))
                if value is not None]
        return (f"{self.stage}: estimated {self.memory_gib:.2g} GiB and {self.minutes:.2g} min"
                + (f" (at most {' and '.join(most)})" if most else "") + f" for {self.sizes}")


def _past_counting(stage: str):
    """An estimate of sizes too large for a float (``report.grid_size: 1e200`` as an integer) as infinite, naming
    the values past 2**53 in the params, instead of an ``OverflowError`` traceback."""

    def decorate(estimate):
        @functools.wraps(estimate)
        def counted(*args, **kwargs):
            try:
                return estimate(*args, **kwargs)
            except OverflowError:
                params = next(a for a in (*args, *kwargs.values()) if isinstance(a, Params))
                huge = [f"{key}={value:.3g}" for key, value in _numbers(params.to_dict()) if abs(value) > 2**53]
                return Estimate(stage or args[0], math.inf, math.inf,
                                f"sizes past counting ({', '.join(huge) or 'the data'})")

        return counted

    return decorate


def _numbers(node, prefix: str = ""):
    """(dotted key, value) of every number in a nested dict of params."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def machine_memory_gib() -> float:
    """Return the physical memory of this machine in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def memory_limit_gib(params: Params) -> float:
    """Return ``params.limits.max_memory_gib``, or :data:`MEMORY_FRACTION` of this machine's memory where it is 0.

    Parameters
    ----------
    params : hbnn.config.Params
    """
    return params.limits.max_memory_gib or MEMORY_FRACTION * machine_memory_gib()


def enforce(estimate: Estimate, params: Params) -> None:
    """Log ``estimate`` and refuse it where it exceeds a limit.

    Parameters
    ----------
    estimate : Estimate
    params : hbnn.config.Params

    Raises
    ------
    hbnn.config.ConfigError
        Naming the limit ``estimate`` exceeds and the sizes to lower.
    """
    log.info("%s", estimate.describe())
    memory = memory_limit_gib(params)
    if (estimate.most_memory_gib or 0) > memory >= estimate.memory_gib:
        log.warning("%s: drawn on to its most, it would pass limits.max_memory_gib=%.3g: lower max_draws if it "
                    "does not meet the bar sooner", estimate.stage, memory)
    if estimate.memory_gib > memory:
        raise ConfigError(f"{estimate.describe()}: over limits.max_memory_gib={memory:.3g}. Lower the sizes above "
                          "(groups, draws or max_draws, hidden units, the named keys), or raise limits.max_memory_gib "
                          "if this machine has the memory")
    if estimate.minutes > params.limits.max_minutes:
        raise ConfigError(f"{estimate.describe()}: over limits.max_minutes={params.limits.max_minutes:g}. Lower the "
                          "sizes above (groups, draws or max_draws, hidden units, the named keys), or raise "
                          "limits.max_minutes to run it anyway")


def n_weights(n_features: int, hidden_layers, bias: bool = False) -> list[int]:
    """Return the weights (and, with ``bias``, biases) per layer of the MLP ``n_features -> hidden_layers... -> 1``.

    Parameters
    ----------
    n_features : int
    hidden_layers : sequence of int
    bias : bool, optional
    """
    sizes = [n_features, *hidden_layers, 1]
    return [(a + int(bias)) * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)]


@_past_counting("make_data")
def data_estimate(params: Params) -> Estimate | None:
    """Return ``make_data``'s cost for moons (from the rows it generates); ``None`` for a table (the file's size).

    Parameters
    ----------
    params : hbnn.config.Params
    """
    if params.data.source != "moons":
        return None
    rows = params.n_groups * params.data.n_samples
    return Estimate("make_data", rows * ROW_BYTES / 2**30, params.n_groups * SECONDS_PER_MOONS_GROUP / 60,
                    f"{params.n_groups} groups x {params.data.n_samples} rows")


def _hierarchical_weights(n_groups: int, layers: list[int]) -> int:
    """Values a hierarchical posterior draw stores: every group's weights twice (the sampler's ``z`` and the weights
    ``w = mu + sd * z``), and each layer's mean and sd."""
    return 2 * n_groups * sum(layers) + sum(layers) + len(layers)


def _sampled_dims(n_groups: int, layers: list[int], hierarchical: bool) -> int:
    """The coordinates one fit samples: the hierarchical fit's every ``z``, ``mu`` and ``log sd``, a per-group
    fit's one group's weights."""
    return n_groups * sum(layers) + sum(layers) + len(layers) if hierarchical else sum(layers)


def _nuts_iterations(s, hierarchical: bool, worst: bool) -> float:
    """NUTS iterations per chain of one fit with sampler settings ``s``: as a fit typically runs (``worst=False``:
    the first fit's, and a hierarchical fit drawn on to :data:`EXPECTED_DRAW_FACTOR` times ``draws``), or the most it
    can (``worst=True``: a hierarchical fit drawn to ``max_draws``; a per-group one fitted again at every multiple of
    ``draws`` up to ``max_draws``, then once more at ``refit_target_accept``; restarts counted by the caller)."""
    if not worst:
        return s.tune + _typical_draws(s, hierarchical)
    if hierarchical or s.max_draws <= s.draws:
        iterations = s.tune + s.draw_limit
    else:  # the first fit, then every refit k = 2 .. max_draws // draws (the worst case: one step at a time)
        k = s.max_refit_factor  # sum of tune + j * draws over j = 1..k, in closed form (k may be ~1e12)
        iterations = k * s.tune + s.draws * k * (k + 1) // 2
    if not hierarchical and s.refit_applies:  # ... and at refit_target_accept, at the longest (smaller steps: twice)
        iterations += 2 * (s.tune + s.max_refit_factor * s.draws)
    return iterations


def _typical_draws(s, hierarchical: bool) -> int:
    """Draws per chain a fit typically ends with: a hierarchical fit drawn on past ``draws`` stops at about
    :data:`EXPECTED_DRAW_FACTOR` times them (at most ``max_draws``); a per-group fit keeps ``draws``."""
    return min(s.draw_limit, EXPECTED_DRAW_FACTOR * s.draws) if hierarchical else s.draws


def _nuts_steps(s, dims: int, worst: bool, informed: bool = False) -> float:
    """Leapfrog steps per NUTS iteration in ``dims`` coordinates: the backend's figure as adapted on the default
    fits (:data:`INFORMED_STEPS_FACTOR` times it under an informed prior), growing with the square root of the
    coordinates, at most NUTS' tree-depth cap of 1023; for nutpie's Stan-style mass matrix,
    :data:`STEPS_DIAG_STAN` growing as measured (:data:`STEPS_GROWTH`) typically, and the cap at worst."""
    cap = STEPS_PER_ITERATION_DIAG_STAN
    if s.backend == "nutpie" and s.mass_matrix == "diag_stan":
        if worst:
            return cap
        return min(cap, STEPS_DIAG_STAN * max(1.0, dims / DIMS_MEASURED) ** STEPS_GROWTH)
    steps = STEPS_PER_ITERATION[s.backend] * (INFORMED_STEPS_FACTOR if informed else 1.0)
    return min(cap, steps * max(1.0, (dims / DIMS_MEASURED) ** 0.5))


def _hand_written(params: Params, hierarchical: bool) -> bool:
    """Whether an ADVI fit of ``params.model`` fits the hand-written density
    (:class:`hbnn.sampling.advi.AdviBackend`): :func:`hbnn.density.densities.unsupported`'s conditions, read from the
    registries here so that the stages that estimate costs do not depend on the density's code (tests/test_budget.py
    holds the two to the same answers)."""
    from hbnn.model import activations, likelihoods

    m = params.model
    return (likelihoods.get(m.likelihood).density_source is not None
            and activations.get(m.activation).compiled_source is not None
            and (m.noise == "shared" or not hierarchical))


@_past_counting("")
def fit_estimate(stage: str, params: Params, n_groups: int, n_train: int, n_test: int, n_features: int,
                 max_group_rows: int | None = None) -> Estimate:
    """Return the :class:`Estimate` of a fit (``fit_flat``, ..., ``transfer_informed``) on tasks of these sizes.

    ``minutes`` and ``memory_gib`` are what such a fit typically takes; ``most_minutes`` and ``most_memory_gib``
    what it can take at most, where that is more (a fit drawn on to ``max_draws``, fitted again, or restarted).

    Parameters
    ----------
    stage : str
        A key of :data:`hbnn.pipeline.variants.FITS`.
    params : hbnn.config.Params
    n_groups, n_train, n_test, n_features : int
        Groups fitted; training and test rows over all groups; features.
    max_group_rows : int, optional
        The largest group's training rows (``None``: as if every group had the same), which the hierarchical fit's
        padded layout and a per-group fit's arrays grow with.
    """
    variant = FITS[stage][1]
    s = params.sampler_for(stage)
    layers = n_weights(n_features, params.model.hidden_layers, params.model.bias)
    per_group = sum(layers)
    hierarchical, informed = variant is HIERARCHICAL, variant is INFORMED
    # a draw stores each group's weights, and under an informed prior (hbnn.model.builders) its whitened z too
    stored_per_group = 2 * per_group if informed else per_group
    stored_params = _hierarchical_weights(n_groups, layers) if hierarchical else n_groups * stored_per_group
    dims = _sampled_dims(n_groups, layers, hierarchical)
    # ADVI fits the hand-written density full batch, and the hierarchical fit's in minibatches too (a per-group
    # minibatch fit stays on PyTensor's: hbnn.sampling.advi.AdviBackend)
    density_advi = (s.backend == "advi" and (hierarchical or not s.advi.minibatch_size)
                    and _hand_written(params, hierarchical))
    if s.backend == "advi":
        rows_per_step = s.advi.minibatch_size or (n_train if hierarchical else n_train / n_groups)
        grad_us = (DENSITY_ADVI_STEP_US + NS_PER_DENSITY_ADVI_PARAM * 1e-3 * dims
                   + NS_PER_MINIBATCH_ROW * 1e-3 * s.advi.minibatch_size if density_advi
                   else ADVI_STEP_US + NS_PER_ADVI_PARAM * 1e-3 * dims)
        steps = {False: s.advi.iterations * s.advi.starts, True: s.advi.iterations * s.advi.starts}
        kept = {worst: s.draw_limit if hierarchical else s.draws for worst in (False, True)}
        tuning = 0
        starts = f" from each of {s.advi.starts} starting points" if s.advi.starts > 1 else ""
        run = f"{s.advi.iterations} ADVI steps{starts}, {s.chains} x {s.draws} draws"
    else:
        rows_per_step = n_train if hierarchical else n_train / n_groups
        grad_us = (KERNEL_GRAD_OVERHEAD_US if s.backend == "nutpie" else GRAD_OVERHEAD_US) + NS_PER_DIM * 1e-3 * dims
        steps = {worst: s.chains * _nuts_iterations(s, hierarchical, worst) * _nuts_steps(s, dims, worst, informed)
                 for worst in (False, True)}
        # draws per chain a trace keeps (a per-group refit is thinned back to draws), and the tuning draws nutpie keeps
        kept = {False: _typical_draws(s, hierarchical), True: s.draw_limit if hierarchical else s.draws}
        tuning = s.tune
        run = _nuts_run(s, hierarchical)
    per_row_weight = KERNEL_NS_PER_ROW_WEIGHT if s.backend == "nutpie" or density_advi else NS_PER_ROW_WEIGHT
    grad_us += per_row_weight * 1e-3 * rows_per_step * per_group
    if informed:
        grad_us += NS_PER_PRIOR_ENTRY * 1e-3 * sum(w * w for w in layers)
    fits = 1 if hierarchical else n_groups
    parallel = 1 if s.backend == "advi" else max(1, min(s.chains, s.cores))
    minutes = {worst: fits * steps[worst] * grad_us * 1e-6 / parallel / 60 for worst in (False, True)}
    if hierarchical and s.restarts_apply:  # each attempt left behind at worst at the last look
        minutes[True] *= 1 + s.restarts
    widest = max_group_rows if max_group_rows is not None else -(-n_train // max(n_groups, 1))
    fixed = _layout_bytes(n_groups if hierarchical else 1, widest, n_features, params)
    fixed += sum(w * w for w in layers) * BYTES * 4 if informed else 0  # covariances, factors
    # while sampling: the sampler's draws and its chains' trajectories (a per-group fit's are one group's, converted as
    # its fit ends; a look's copy of the draws so far fits within SAMPLER_COPIES, as measured), and at worst, restarted,
    # the last attempt's kept draws. Then every kept draw and its scores (PyMC keeps the tuning draws in its trace, to
    # count gradient evaluations)
    running = stored_params if hierarchical else stored_per_group
    states = 0 if s.backend == "advi" else s.chains * dims * NUTS_STATE_VALUES * BYTES
    memory = {}
    for worst in (False, True):
        draws = s.chains * kept[worst]
        sampling = s.chains * (kept[worst] + tuning) * running * BYTES * SAMPLER_COPIES + states
        if worst and hierarchical and s.restarts_apply:
            sampling += draws * stored_params * BYTES * COPIES
        held = draws + (s.chains * tuning if s.backend == "pymc" else 0)
        scoring = held * stored_params * BYTES * COPIES + draws * (n_train + n_test) * BYTES * COPIES
        scoring += draws * n_train * BYTES * LOO_COPIES  # PSIS-LOO (hbnn.diagnostics.evaluation.psis_loo)
        memory[worst] = PROCESS_GIB + (max(sampling, scoring) + fixed) / 2**30
    sizes = f"{n_groups} groups, {n_train} training rows, {per_group} weights per group, {run} ({s.backend})"
    if hierarchical and widest * n_groups > 2 * n_train:  # the padding is what costs: say so
        sizes += f"; every group padded to the largest's {widest} rows: {widest * n_groups} rows held"
    first = None
    if hierarchical and s.max_draws > s.draws and s.backend != "advi":  # time to its first look
        first = minutes[False] * (s.tune + s.draws) / _nuts_iterations(s, True, False)
    return Estimate(stage, memory[False], minutes[False], sizes, first,
                    most_minutes=minutes[True] if minutes[True] > minutes[False] else None,
                    most_memory_gib=memory[True] if memory[True] > memory[False] else None)


def _nuts_run(s, hierarchical: bool) -> str:
    """The NUTS run an estimate counts, in words: iterations, and what can make it longer."""
    longer = []
    if s.max_draws > s.draws:
        longer.append(f"drawn on up to max_draws={s.max_draws} where the bar is not met" if hierarchical else
                      f"fitted again with up to max_draws={s.max_draws} draws where a group misses the bar")
    if not hierarchical and s.refit_applies:
        longer.append(f"at refit_target_accept={s.refit_target_accept} where one diverges past the bar")
    if hierarchical and s.restarts_apply:
        longer.append(f"started again up to restarts={s.restarts} times where its chains go wrong")
    typical = (f"typically {s.chains} chains x {s.tune} + {_typical_draws(s, True)} iterations"
               if hierarchical and s.max_draws > s.draws else f"{s.chains} chains x {s.tune} + {s.draws} iterations")
    return typical + ("; at most: " + ", ".join(longer) if longer else "")


def _layout_bytes(n_groups: int, rows: int, n_features: int, params: Params) -> float:
    """The fit's data laid out ``(group, row, feature)``, every group padded to ``rows``: the padded tasks, the
    hand-written density's buffer, and the first fit of a model's check of that density against PyMC's, which
    evaluates PyMC's log density and gradient over the same layout (:data:`CHECK_VALUES_PER_UNIT`)."""
    units = sum(params.model.hidden_layers) + 1  # every layer's output, per row
    per_row = LAYOUT_COPIES * n_features + CHECK_VALUES_PER_UNIT * units
    return n_groups * rows * per_row * BYTES


# derive_prior: the hierarchical posterior as read (every stored weight), the new-group draws of each layer, their noise
# and the fit's centred copy (hbnn.model.prior); reading counted at 50 MB/s, slower than a disk reads, to cover the
# stage's decoding and its process start as the 1000-group posterior measured (benchmarks/FINDINGS.md, "Measurements
# behind code comments")
PRIOR_COPIES = 3
NS_PER_PRIOR_VALUE = 5.0
READ_BYTES_PER_S = 5e7
# report: each model's worker (three at once) reads its model's posterior and, with trace.pointwise, the training rows'
# log-likelihood for PSIS-LOO (LOO_COPIES), and holds the grid's points, one page's surfaces (mean and sd) and
# matplotlib's images of them (its float64 copy, the colour-mapped RGBA: ~6 values a grid point a panel), besides a
# fixed chunk of network outputs (hbnn.report.numbers.CHUNK_VALUES). Time, on the cores: the network over every kept
# draw at every grid point (per weight), matplotlib's time a surface panel, PSIS-LOO per value, plus a fixed time of
# reading, ArviZ's figures and writing, each rounded up from its measured cost, so the default run and the 1000-group
# configuration are estimated at or above their measured times and memory (benchmarks/FINDINGS.md, "Measurements behind
# code comments").
REPORT_WORKERS = 3
SURFACE_VALUES_PER_PANEL_POINT = 6
SURFACE_CHUNK_BYTES = 2**21 * 12
NS_PER_SURFACE_WEIGHT = 1.0
SECONDS_PER_SURFACE_PANEL = 0.1
NS_PER_LOO_VALUE = 250.0
REPORT_FIXED_SECONDS = 15.0


@_past_counting("")
def prior_estimate(stage: str, params: Params, posterior_draws: int, n_groups: int, n_features: int) -> Estimate:
    """Return the :class:`Estimate` of deriving the informed prior (``derive_prior``; ``transfer_prior`` after its fit).

    The cost is reading ``posterior_draws`` draws (all chains) of a hierarchical posterior of ``n_groups`` groups,
    and ``prior.draws_per_sample`` new-group draws of every layer's weights for each draw.

    Parameters
    ----------
    stage : str
    params : hbnn.config.Params
    posterior_draws, n_groups, n_features : int
    """
    layers = n_weights(n_features, params.model.hidden_layers, params.model.bias)
    read = posterior_draws * _hierarchical_weights(n_groups, layers) * BYTES
    values = posterior_draws * params.prior.draws_per_sample * sum(layers)
    covariances = sum(w * w for w in layers) * BYTES * 4
    memory = (read * COPIES + values * BYTES * PRIOR_COPIES + covariances) / 2**30
    minutes = (read / READ_BYTES_PER_S + values * NS_PER_PRIOR_VALUE * 1e-9) / 60
    return Estimate(stage, memory, minutes,
                    f"{posterior_draws} posterior draws of {n_groups} groups x prior.draws_per_sample="
                    f"{params.prior.draws_per_sample} new-group draws of {sum(layers)} weights")


@_past_counting("report")
def report_estimate(params: Params, n_groups: int, n_features: int, posterior_draws: int, n_train: int,
                    models: int = 3) -> Estimate:
    """Return the :class:`Estimate` of the report for ``models`` models of ``n_groups`` groups.

    Each model's posterior and PSIS-LOO, and its decision surfaces (``report.grid_size`` squared points,
    ``report.surface_draws`` draws, ``report.panels_per_page`` groups a page) of ``report.surface_groups`` groups.

    Parameters
    ----------
    params : hbnn.config.Params
    n_groups, n_features, posterior_draws, n_train : int
        Groups, features, draws per model (all chains) and training rows.
    models : int, optional
    """
    r = params.report
    layers = n_weights(n_features, params.model.hidden_layers, params.model.bias)
    points = r.grid_size**2 if n_features >= 2 else 0
    panels = min(n_groups, r.panels_per_page)
    loo_values = posterior_draws * n_train if params.trace.pointwise else 0
    per_worker = (posterior_draws * _hierarchical_weights(n_groups, layers) * BYTES * COPIES
                  + loo_values * BYTES * LOO_COPIES
                  + points * BYTES * (2 * n_features + 2 * panels * SURFACE_VALUES_PER_PANEL_POINT)
                  + SURFACE_CHUNK_BYTES)
    draws, surfaced = min(r.surface_draws, posterior_draws), min(n_groups, r.surface_groups or n_groups)
    surface_s = models * surfaced * draws * points * sum(layers) * NS_PER_SURFACE_WEIGHT * 1e-9
    panels_s = models * 2 * surfaced * SECONDS_PER_SURFACE_PANEL if points else 0.0
    loo_s = models * loo_values * NS_PER_LOO_VALUE * 1e-9
    cores = max(1, min(REPORT_WORKERS, os.cpu_count() or 1))
    minutes = (REPORT_FIXED_SECONDS + (surface_s + panels_s + loo_s) / cores) / 60
    return Estimate("report", REPORT_WORKERS * per_worker / 2**30, minutes,
                    f"{models} models x {n_groups} groups ({surfaced} with surfaces), {posterior_draws} draws, "
                    f"{draws} of them on {points} grid points (report.grid_size={r.grid_size}), {panels} panels a page")
