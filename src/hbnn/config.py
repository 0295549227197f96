"""Typed, validated parameters.

``params.yaml`` is read once per stage into a frozen :class:`Params` (:mod:`hbnn.config_read`). Every check of a value
and of keys against each other is here (each section's ``check``, then :meth:`Params.check`), before any data is
generated or any sampler starts, and a failure raises :class:`ConfigError` naming the dotted key and the bad value.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import reprlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hbnn.errors import InputError
from hbnn.model import activations, likelihoods
from hbnn.names import name_problem

NUTS_BACKENDS = ("nutpie", "pymc", "numpyro", "blackjax")  # the samplers: what sampler.backend may name besides advi
BACKENDS = (*NUTS_BACKENDS, "advi")
# nutpie's adaptations: diag (from the draws' and the gradients' variances), low_rank (its low-rank modified mass
# matrix: nutpie only) and diag_stan (from the draws' variances, as Stan, PyMC, NumPyro and BlackJAX adapt it: the
# other backends' one adaptation, which either diag word gives them)
MASS_MATRICES = ("diag", "low_rank", "diag_stan")
ALIGN_METHODS = ("chains", "reference_chain")  # how the informed prior matches chains (hbnn.model.alignment)
PRIOR_METHODS = ("mvnormal", "plugin")  # prior.method: fitted to draws over the posterior, or at its top draw's mu, sd
SOURCES = ("moons", "table")  # where the tasks come from (hbnn.data.tasks.make_tasks)
LIKELIHOODS = tuple(likelihoods.LIKELIHOODS)  # the registered ones: a new module there is a new model.likelihood
ACTIVATIONS = tuple(activations.ACTIVATIONS)  # likewise for model.activation
NOISES = ("shared", "group")  # model.noise: the hierarchical gaussian model's noise sd, one for all groups or per group
PARQUET_SUFFIXES = (".parquet", ".pq")  # read with pandas' Parquet reader; anything else in TABLE_SUFFIXES is CSV
TABLE_SUFFIXES = (".csv", *PARQUET_SUFFIXES)
MAX_SEED = 2**32 - 1  # NumPy's legacy RandomState (the moons data) takes seeds below 2**32
# fits that take hier_sampler (hbnn.pipeline.variants.FITS); the transfer ones tune for transfer.tune iterations
HIERARCHICAL_FITS = ("fit_hier", "transfer_hier", "transfer_refit")
# The convergence bar (Stan's and ArviZ's practice) every reported quantity is judged against
# (hbnn.diagnostics.evaluation); here so that check_params can hold the settings against it without loading the
# evaluation's imports.
RHAT_MAX = 1.01
ESS_MIN = 400
DIVERGENT_SHARE_MAX = 0.001  # of a fit's draws


class ConfigError(InputError):
    """A parameter is missing, unknown, of the wrong type or out of range."""


class Section:
    """A section of ``params.yaml``: a frozen dataclass of settings that checks its own values (:meth:`check`)."""

    def check(self, key: str) -> None:
        """Check every value of the section, and the values against each other.

        Parameters
        ----------
        key : str
            The section's dotted key in ``params.yaml`` (``sampler``, ``hier_sampler.advi``), which errors name.

        Raises
        ------
        ConfigError
            Naming the dotted key and the value that cannot be used.
        """


@dataclass(frozen=True)
class DataParams(Section):
    """Where the tasks come from: rotated two-moons (seed 000) or a user's table.

    ``n_samples``, ``noise`` and ``rotation_deg`` only shape the moons; ``path``, ``features``, ``label``, ``group``,
    ``split`` and ``standardize`` only apply to ``source: table``. ``train_fraction`` is used by both (moons: the first
    rows of each group; tables without a ``split`` column: a seeded, label-stratified share of each group).
    """

    source: str = "moons"
    n_samples: int = 100
    noise: float = 0.3
    rotation_deg: float = 90.0
    train_fraction: float = 0.5
    path: str = "data/examples/sites.csv"
    features: tuple[str, ...] = ("temperature", "pressure", "humidity")
    label: str = "failed"
    group: str = "site"
    split: str = ""  # "" = no split column: split each group at random, stratified by label
    standardize: bool = True

    def check(self, key: str) -> None:
        _require(self.source in SOURCES, f"{key}.source", self.source, f"must be one of {list(SOURCES)}")
        _require(self.n_samples >= 2, f"{key}.n_samples", self.n_samples, "must be >= 2")
        _require(self.noise >= 0, f"{key}.noise", self.noise, "must be >= 0")
        _require(self.rotation_deg >= 0, f"{key}.rotation_deg", self.rotation_deg, "must be >= 0")
        _require(0 < self.train_fraction < 1, f"{key}.train_fraction", self.train_fraction,
                 "must lie strictly between 0 and 1")
        if self.source == "moons":
            n_train = round(self.n_samples * self.train_fraction)
            _require(1 <= n_train < self.n_samples, f"{key}.train_fraction", self.train_fraction,
                     f"leaves {n_train} of {self.n_samples} rows for training; need >= 1 train and >= 1 test")
            return
        _require(bool(self.path), f"{key}.path", self.path, "data.source=table needs the path of a CSV or Parquet file")
        _require(Path(self.path).suffix.lower() in TABLE_SUFFIXES, f"{key}.path", self.path,
                 f"must end in one of {list(TABLE_SUFFIXES)}")
        _require(len(self.features) >= 1, f"{key}.features", list(self.features),
                 "data.source=table needs at least one feature column")
        for i, name in enumerate(self.features):
            _require_name(name, f"{key}.features[{i}]")
            _require(name not in self.features[:i], f"{key}.features[{i}]", name, "is listed twice")
        for field_name in ("label", "group", "split"):
            column = getattr(self, field_name)
            if field_name != "split" or column:  # split "": no split column
                _require_name(column, f"{key}.{field_name}")
            _require(column not in self.features, f"{key}.{field_name}", column, "is also listed in data.features")
        roles = {"label": self.label, "group": self.group, "split": self.split}
        for i, (role, column) in enumerate(roles.items()):  # the later of two keys naming one column is the bad one
            earlier = [r for r, c in list(roles.items())[:i] if c and c == column]
            _require(not earlier, f"{key}.{role}", column,
                     f"names the same column as data.{earlier[0] if earlier else ''}; data.label, data.group and "
                     "data.split must name different columns")


@dataclass(frozen=True)
class ModelParams(Section):
    """Network shape, activation, likelihood and the flat net's weight prior.

    ``hidden_layers: []`` (or ``0``) is a linear model ``features -> output``. ``activation`` is the hidden units'
    (:mod:`hbnn.model.activations`). A likelihood's extra parameter has a ``HalfNormal(noise_sd)`` prior: gaussian's
    noise sd on the standardised label scale, negative_binomial's dispersion. ``bias`` adds a bias to every hidden and
    output unit, with the same prior as the weights of its layer (:mod:`hbnn.model.network`). ``noise`` is the
    hierarchical gaussian model's noise sd: ``shared`` by all groups, or one per ``group`` drawn from a learned
    log-normal (:mod:`hbnn.model.builders`).
    """

    hidden_layers: tuple[int, ...] = (5, 5)
    prior_sd: float = 1.0
    likelihood: str = "bernoulli"
    noise_sd: float = 1.0
    bias: bool = False  # false: the original networks (and numbers); true: a bias per hidden and output unit
    activation: str = "tanh"
    noise: str = "shared"  # shared: one noise sd for all groups (the original model); group: one per group, pooled

    def check(self, key: str) -> None:
        for i, h in enumerate(self.hidden_layers):
            _require(h >= 1, f"{key}.hidden_layers[{i}]", h, "must be >= 1")
        _require(self.prior_sd > 0, f"{key}.prior_sd", self.prior_sd, "must be > 0")
        _require(self.likelihood in LIKELIHOODS, f"{key}.likelihood", self.likelihood,
                 f"must be one of {list(LIKELIHOODS)}")
        _require(self.noise_sd > 0, f"{key}.noise_sd", self.noise_sd, "must be > 0")
        _require(self.activation in ACTIVATIONS, f"{key}.activation", self.activation,
                 f"must be one of {list(ACTIVATIONS)}")
        _require(self.noise in NOISES, f"{key}.noise", self.noise, f"must be one of {list(NOISES)}")
        _require(self.noise == "shared" or self.likelihood == "gaussian", f"{key}.noise", self.noise,
                 f"is for likelihood gaussian only (model.likelihood is {self.likelihood!r})")


@dataclass(frozen=True)
class AdviParams(Section):
    """Mean-field ADVI (``sampler.backend: advi``)."""

    iterations: int = 20000
    learning_rate: float = 0.01
    minibatch_size: int = 0  # 0: full batch; else rows per gradient step, drawn with replacement
    init_jitter: float = 0.5  # sd of the noise added to the starting means (breaks hidden-unit symmetry)
    starts: int = 1  # fits from this many starting points; the one with the highest ELBO (lowest final loss) is kept

    def check(self, key: str) -> None:
        _require(self.iterations >= 1, f"{key}.iterations", self.iterations, "must be >= 1")
        _require(self.learning_rate > 0, f"{key}.learning_rate", self.learning_rate, "must be > 0")
        _require(self.minibatch_size >= 0, f"{key}.minibatch_size", self.minibatch_size, "must be >= 0 (0: full batch)")
        _require(self.init_jitter >= 0, f"{key}.init_jitter", self.init_jitter, "must be >= 0")
        _require(self.starts >= 1, f"{key}.starts", self.starts, "must be >= 1")


@dataclass(frozen=True)
class SamplerParams(Section):
    """Inference settings of a fit stage: ``sampler`` (the per-group fits) or ``hier_sampler``.

    NUTS backends use chains/tune/draws/target_accept; ``advi`` fits the approximation with ``advi.*`` and then draws
    ``chains x draws`` from it. ``max_draws`` (0: off; the hierarchical fit: nutpie and numpyro; the per-group fits: the
    NUTS backends, ADVI ignores it) lets a fit draw past ``draws`` per chain while its draws miss the convergence bar,
    up to ``max_draws`` per chain. The hierarchical fit goes on: it looks again where its smallest ESS so far
    extrapolates to the bar, at most 20% of the draws so far and at most ``draws`` further (nutpie: in steps of 100
    draws; numpyro: a block of ``draws`` at a time) (:meth:`hbnn.sampling.sampler.Sampler.sample`,
    :func:`hbnn.sampling.runlength._next_check`). A per-group fit that misses it is fitted again from its seed with
    ``k`` times ``draws`` and its chains thinned by ``k``, since a stage's groups share one draw count
    (:func:`hbnn.fitting.per_group.fit_per_group`). ``refit_target_accept`` (the per-group NUTS fits; off at 0 or at
    most ``target_accept``): a group whose fit diverges more often than the bar allows (0.1% of its draws) is fitted
    again from its seed at this target_accept (smaller steps), once; longer too where its R-hat or ESS also miss. More
    draws do not dilute divergences: they mark regions the step size is too large for, which a smaller step size
    resolves. ``restarts`` (the hierarchical fit, nutpie, with ``max_draws`` past ``draws``; ignored otherwise): at any
    look, chains that diverge past the bar's share or sit in a region of clearly lower log density while the chains
    disagree are started again, up to this many times, from the best chain's draws
    (:func:`hbnn.sampling.restarts.restart_reason`); the metrics and the trace record each restart with its numbers.
    """

    backend: str = "nutpie"
    chains: int = 2
    tune: int = 300
    draws: int = 1000
    target_accept: float = 0.9
    seed: int = 1
    cores: int = 2
    mass_matrix: str = "diag"
    max_draws: int = 0
    refit_target_accept: float = 0.0
    restarts: int = 0
    advi: AdviParams = field(default_factory=AdviParams)

    def check(self, key: str) -> None:
        # sampler: the per-group fits, which meet max_draws by refitting and thinning (any block size, any
        # backend); the joint fit goes on from its chains, in blocks, where its backend can
        per_group = key == "sampler"
        _require(self.backend in BACKENDS, f"{key}.backend", self.backend, f"must be one of {list(BACKENDS)}")
        _require(self.chains >= 1, f"{key}.chains", self.chains, "must be >= 1")
        _require(self.tune >= 0, f"{key}.tune", self.tune, "must be >= 0")
        _require(self.draws >= 1, f"{key}.draws", self.draws, "must be >= 1")
        _require(0 < self.target_accept < 1, f"{key}.target_accept", self.target_accept,
                 "must lie strictly between 0 and 1")
        _check_seed(self.seed, f"{key}.seed")
        _require(self.cores >= 1, f"{key}.cores", self.cores, "must be >= 1")
        _require(self.mass_matrix in MASS_MATRICES, f"{key}.mass_matrix", self.mass_matrix,
                 f"must be one of {list(MASS_MATRICES)}")
        # diag and diag_stan name nutpie's two diagonal adaptations; PyMC, NumPyro and BlackJAX have one, from the
        # draws' variances as Stan's (diag_stan), so either word is theirs (and -S hier_sampler.backend=numpyro works
        # on the committed diag_stan); ADVI has none
        _require(self.mass_matrix != "low_rank" or self.backend == "nutpie", f"{key}.mass_matrix", self.mass_matrix,
                 f"needs {key}.backend=nutpie (the other backends adapt a diagonal mass matrix)")
        _require(self.max_draws == 0 or self.max_draws >= self.draws, f"{key}.max_draws", self.max_draws,
                 f"must be 0 (off) or >= {key}.draws={self.draws}")
        _require(self.max_draws == 0 or self.max_draws % self.draws == 0 or per_group, f"{key}.max_draws",
                 self.max_draws,
                 f"must be a whole number of blocks of {key}.draws={self.draws} (the fit goes on a block at a time)")
        _require(self.max_draws == 0 or self.chains >= 2, f"{key}.max_draws", self.max_draws,
                 f"needs {key}.chains >= 2 (R-hat, part of the bar it draws until, needs 2 chains); set it to 0")
        _require(self.max_draws == 0 or self.backend in ("numpyro", "nutpie") or per_group, f"{key}.max_draws",
                 self.max_draws,
                 f"needs {key}.backend=nutpie or numpyro (the backends here that can draw on until the draws meet "
                 "the bar); set it to 0")
        _require(0 <= self.refit_target_accept < 1, f"{key}.refit_target_accept", self.refit_target_accept,
                 "must lie in [0, 1) (0: off)")
        _require(self.refit_target_accept == 0 or per_group, f"{key}.refit_target_accept", self.refit_target_accept,
                 "must be 0: the hierarchical fit's chains start again where they diverge (hier_sampler.restarts)")
        _require(self.restarts >= 0, f"{key}.restarts", self.restarts, "must be >= 0")
        _require(self.restarts == 0 or not per_group, f"{key}.restarts", self.restarts,
                 "must be 0: a per-group fit that misses the bar is fitted again longer instead (max_draws)")
        self.advi.check(f"{key}.advi")

    @property
    def restarts_apply(self) -> bool:
        """Whether a fit with these settings judges its chains at its looks (``restarts``)."""
        return self.restarts > 0 and self.backend == "nutpie" and self.max_draws > self.draws

    @property
    def refit_applies(self) -> bool:
        """Whether a per-group fit with these settings is fitted again at ``refit_target_accept`` where it diverges
        past the bar (above ``target_accept``; not ADVI, which has no divergences)."""
        return self.refit_target_accept > self.target_accept and self.backend != "advi"

    @property
    def max_refit_factor(self) -> int:
        """The most times ``draws`` a per-group fit drawn again longer runs: ``max_draws // draws``, at least 1."""
        return max(1, self.max_draws // self.draws)

    @property
    def draw_limit(self) -> int:
        """The most draws per chain a fit can keep: ``max_draws`` where set, else ``draws``."""
        return max(self.draws, self.max_draws)


# The per-group fits' defaults (flat, informed, transfer): a group whose 1000 draws per chain miss the bar is fitted
# again longer and thinned (max_draws) rather than reported not converged, and one that diverges past the bar is
# fitted again at target_accept 0.97 (benchmarks/FINDINGS.md, "Per-group fits drawn again where they miss the bar").
SAMPLER = SamplerParams(draws=1000, max_draws=4000, refit_target_accept=0.97)


# The hierarchical fit's defaults, chosen by measurement (benchmarks/FINDINGS.md, "Converged defaults", "A
# hand-written log density", "Looking again where the ESS extrapolates", "target_accept 0.98 again and shorter tuning
# for the held-out fit", "Every data seed to the bar"): nutpie on the hand-written density, Stan's diagonal mass matrix;
# 500 draws, then looks again where the smallest ESS extrapolates to the bar, up to 10,000 (moons data seeds 2 and 8:
# 8,200 and 6,200; others by 3,100); target_accept 0.98 needs fewer leapfrog steps than 0.99 at most data seeds.
HIER_SAMPLER = SamplerParams(backend="nutpie", chains=2, tune=1000, draws=500, target_accept=0.98,
                             mass_matrix="diag_stan", max_draws=10000, restarts=2)


@dataclass(frozen=True)
class PriorParams(Section):
    """How the informed prior is derived from the hierarchical posterior."""

    method: str = "mvnormal"
    draws_per_sample: int = 10
    align: str = "chains"
    reference_chain: int = 0
    jitter: float = 1e-6
    seed: int = 2

    def check(self, key: str) -> None:
        _require(self.method in PRIOR_METHODS, f"{key}.method", self.method, f"must be one of {list(PRIOR_METHODS)}")
        _require(self.draws_per_sample >= 1, f"{key}.draws_per_sample", self.draws_per_sample, "must be >= 1")
        _require(self.align in ALIGN_METHODS, f"{key}.align", self.align, f"must be one of {list(ALIGN_METHODS)}")
        _require(self.reference_chain >= 0, f"{key}.reference_chain", self.reference_chain, "must be >= 0")
        # Positive, so the fitted covariance always has a Cholesky factor.
        _require(self.jitter > 0, f"{key}.jitter", self.jitter, "must be > 0")
        _check_seed(self.seed, f"{key}.seed")


@dataclass(frozen=True)
class TransferParams(Section):
    """The transfer experiment: groups held out of a hierarchical fit, refit with few rows of their own.

    ``transfer_prior`` holds out ``max(min_holdout, round(holdout_fraction * n_groups))`` groups (seeded, at most
    ``n_groups - 2``, so two groups are left to fit the hierarchy), fits the hierarchical model on the rest and derives
    the informed prior from it. ``transfer`` then fits each held-out group on nested, seeded subsets of its training
    rows (``sizes``, plus all its rows when ``all_rows``), stratified by label for classifiers, with the flat and the
    informed prior, and scores them and the population's prediction (no rows) on the group's own test rows.

    ``transfer_refit`` refits the hierarchical model on the other groups plus every held-out group's first ``n`` rows,
    for each ``n`` of ``refit_sizes`` that is one of ``sizes`` (and all rows where ``refit_all_rows`` and ``all_rows``):
    the partial pooling the informed prior should approach. ``tune`` is the tuning iterations of these hierarchical fits
    (``hier_sampler``'s other settings apply): they meet the convergence bar with less tuning than ``fit_hier``
    (benchmarks/FINDINGS.md).
    """

    holdout_fraction: float = 0.333
    min_holdout: int = 4
    sizes: tuple[int, ...] = (2, 4, 8, 16, 32)
    all_rows: bool = True
    seed: int = 3
    tune: int = 600
    refit_sizes: tuple[int, ...] = (2, 4, 8, 16, 32)
    refit_all_rows: bool = True

    def check(self, key: str) -> None:
        _require(0 < self.holdout_fraction < 1, f"{key}.holdout_fraction", self.holdout_fraction,
                 "must lie strictly between 0 and 1")
        _require(self.min_holdout >= 1, f"{key}.min_holdout", self.min_holdout, "must be >= 1")
        for i, n in enumerate(self.sizes):
            _require(n >= 1, f"{key}.sizes[{i}]", n, "must be >= 1 (training rows of a held-out group)")
        _require(list(self.sizes) == sorted(set(self.sizes)), f"{key}.sizes", list(self.sizes),
                 "must be strictly increasing (each size's rows contain the smaller sizes' rows)")
        _require(bool(self.sizes) or self.all_rows, f"{key}.sizes", list(self.sizes),
                 f"is empty and {key}.all_rows is false: there is nothing to fit")
        _check_seed(self.seed, f"{key}.seed")
        _require(self.tune >= 0, f"{key}.tune", self.tune, "must be >= 0")
        for i, n in enumerate(self.refit_sizes):
            _require(n >= 1, f"{key}.refit_sizes[{i}]", n, "must be >= 1 (training rows of a held-out group)")


@dataclass(frozen=True)
class BaselinesParams(Section):
    """The ``baselines`` stage's scikit-learn reference models (:mod:`hbnn.pipeline.stages.baselines`)."""

    seed: int = 4  # gradient boosting's random_state is derived from it

    def check(self, key: str) -> None:
        _check_seed(self.seed, f"{key}.seed")


@dataclass(frozen=True)
class ReportParams(Section):
    """Decision-surface grid and the draws used to draw it."""

    grid_size: int = 100
    grid_limit: float = 3.0
    surface_draws: int = 500
    panels_per_page: int = 36
    embedded_pages: int = 0  # surface pages per model and figure shown in report.html; 0: all (others are linked)
    surface_groups: int = 36  # groups per model whose surfaces are drawn (hbnn.report.selection); 0: every group

    def check(self, key: str) -> None:
        _require(self.grid_size >= 2, f"{key}.grid_size", self.grid_size, "must be >= 2")
        _require(self.grid_limit > 0, f"{key}.grid_limit", self.grid_limit, "must be > 0")
        _require(self.surface_draws >= 1, f"{key}.surface_draws", self.surface_draws, "must be >= 1")
        _require(self.panels_per_page >= 1, f"{key}.panels_per_page", self.panels_per_page, "must be >= 1")
        _require(self.embedded_pages >= 0, f"{key}.embedded_pages", self.embedded_pages, "must be >= 0 (0: all pages)")
        _require(self.surface_groups >= 0, f"{key}.surface_groups", self.surface_groups, "must be >= 0 (0: all groups)")


@dataclass(frozen=True)
class TraceParams(Section):
    """What the fit stages keep in their traces besides the posterior and its sample stats."""

    # log_likelihood (per training row) and predictions (per test row) groups, so ArviZ's loo, compare
    # and rhat work on the trace alone; they cost chains * draws * rows * 16 bytes. The LOO metrics are
    # computed either way.
    pointwise: bool = True

    def check(self, key: str) -> None:
        """Nothing beyond its type, which the parser checks."""


@dataclass(frozen=True)
class LimitParams(Section):
    """Guards against runs too large for this machine (:mod:`hbnn.pipeline.budget`); they change no result.

    Each stage estimates its peak memory and time before it starts and refuses past these limits, printing the estimate.
    """

    max_memory_gib: float = 0.0  # 0: 80% of this machine's memory
    max_minutes: float = 180.0  # per stage

    def check(self, key: str) -> None:
        _require(self.max_memory_gib >= 0, f"{key}.max_memory_gib", self.max_memory_gib,
                 "must be >= 0 (0 means 80% of this machine's memory)")
        _require(self.max_minutes > 0, f"{key}.max_minutes", self.max_minutes, "must be > 0")


@dataclass(frozen=True)
class Params:
    """Everything in ``params.yaml``; ``n_groups`` and ``seed`` sit at the top level."""

    n_groups: int = 18
    seed: int = 31
    data: DataParams = field(default_factory=DataParams)
    model: ModelParams = field(default_factory=ModelParams)
    sampler: SamplerParams = field(default_factory=lambda: SAMPLER)
    hier_sampler: SamplerParams = field(default_factory=lambda: HIER_SAMPLER)
    prior: PriorParams = field(default_factory=PriorParams)
    transfer: TransferParams = field(default_factory=TransferParams)
    baselines: BaselinesParams = field(default_factory=BaselinesParams)
    report: ReportParams = field(default_factory=ReportParams)
    trace: TraceParams = field(default_factory=TraceParams)
    limits: LimitParams = field(default_factory=LimitParams)

    def check(self) -> None:
        _require(self.n_groups >= 1, "n_groups", self.n_groups, "must be >= 1")
        _check_seed(self.seed, "seed")
        for f in fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                value.check(f.name)
        _require(
            self.data.source == "table" or likelihoods.LIKELIHOODS[self.model.likelihood].classifier,
            "model.likelihood",
            self.model.likelihood,
            "the moons data have 0/1 labels, for a classifier (bernoulli); other likelihoods need data.source=table",
        )
        # Checked here, not in derive_prior, so a bad value stops before the fits sample.
        _require(self.prior.reference_chain < self.hier_sampler.chains, "prior.reference_chain",
                 self.prior.reference_chain,
                 f"must be < hier_sampler.chains={self.hier_sampler.chains} (the prior is the hierarchical fit's)")

    def sampler_for(self, stage: str) -> SamplerParams:
        """The sampler settings of a fit: ``hier_sampler`` for the hierarchical fits, else ``sampler``.

        Parameters
        ----------
        stage : str
            A fit of :data:`hbnn.pipeline.variants.FITS`; the transfer ones tune for ``transfer.tune`` iterations.

        Returns
        -------
        SamplerParams
        """
        if stage in HIERARCHICAL_FITS[1:]:
            return dataclasses.replace(self.hier_sampler, tune=self.transfer.tune)
        return self.hier_sampler if stage in HIERARCHICAL_FITS else self.sampler

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists), as it would appear in YAML."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def section_hash(self, *keys: str) -> str:
        """Short SHA-256 of the named params (dotted keys allowed), for provenance attrs."""
        full = self.to_dict()
        for *parents, leaf in (k for k, default in _ADDED_KEYS.items() if _at(full, k) == default):
            del _at(full, parents)[leaf]  # at its default a key hashes as params without it: one hash
        blob = json.dumps({key: _at(full, key.split(".")) for key in keys}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# keys added after runs were stamped, with the default that reproduces those runs (Params.section_hash)
_ADDED_KEYS = {("prior", "method"): PRIOR_METHODS[0], **{(s, "advi", "starts"): 1 for s in ("sampler", "hier_sampler")}}
_short = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxstring, _short.maxother = 2, 4, 4, 60, 60


def _at(tree: dict, path) -> Any:
    """The value of nested dict ``tree`` at the keys ``path``."""
    return functools.reduce(dict.__getitem__, path, tree)


def _show(value: Any) -> str:
    """``repr(value)``, cut short: a message must stay one readable line whatever the value."""
    return _short.repr(value)


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"invalid parameter {key}={_show(value)}: {why}")


def _require_name(name: str, key: str) -> None:
    problem = name_problem(name)
    _require(problem is None, key, name, f"not usable as a column name: the name {problem}")


def _check_seed(seed: int, key: str) -> None:
    _require(0 <= seed <= MAX_SEED, key, seed, f"must lie in [0, {MAX_SEED}] (2**32 - 1)")
