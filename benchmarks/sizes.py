"""How much each section of `make bench` (benchmarks/run.py) measures: :data:`FULL`, and :data:`SMOKE` for a run of
every row and section at tiny settings (``python -m benchmarks.run --smoke``), which checks that each builds params
the stages accept and that the JSON and table come out whole (tests/test_benchmarks.py), not what they cost."""

from __future__ import annotations

from dataclasses import dataclass, field

# Sampler seeds of every backends row: each figure is the median over them.
SEEDS = (1, 2, 3)
COMMON = {"chains": 2, "tune": 1000, "draws": 1000}  # every row but `default`: 2 chains x (1000 + 1000)

# The documented configuration for thousands of groups (docs/many-groups.md, "Thousands of groups"): the per-group
# fits by NUTS as committed (at 1000 groups each per-group stage samples in about 2 minutes on 2 cores, every group
# meeting the bar), the hierarchical fits by minibatch ADVI over the hand-written density (NUTS at 1000 groups is
# estimated at ~50 min: 200 groups took 7.5; 100,000 steps, 89 s of sampling: at 60,000 the loss was still falling,
# 0.87% over the last quarter, at 100,000 it fell 0.09%), 2 x 500 draws from its approximation, 1% of the groups
# held out for the transfer stages and no hierarchical refit (each would be another fit of all 1000 groups), no
# pointwise trace groups, 2 of the surface pages per model and figure embedded in report.html; the per-group fits in
# the stage's process
# (MANY_GROUPS_SCHEDULER "": the 2 chains already use both cores; a 2-worker LocalCluster took 239 s against 205 s for
# the flat stage). tests/test_benchmarks.py checks that the docs' `dvc exp run` line sets exactly these.
MANY_GROUPS = {
    "n_groups": 1000,
    "hier_sampler": {"backend": "advi", "draws": 500, "max_draws": 0,
                     "advi": {"iterations": 100000, "minibatch_size": 500}},
    "transfer": {"holdout_fraction": 0.01, "refit_sizes": [], "refit_all_rows": False},
    "trace": {"pointwise": False},
    "report": {"embedded_pages": 2},
}
MANY_GROUPS_SCHEDULER = ""


def overridden(raw: dict, overrides: dict) -> dict:
    """``raw`` with ``overrides`` merged in, section by section (a nested dict changes only the keys it names)."""
    out = dict(raw)
    for key, value in overrides.items():
        out[key] = overridden(raw.get(key, {}), value) if isinstance(value, dict) else value
    return out


@dataclass(frozen=True)
class Sizes:
    """The sizes of every section of benchmarks/run.py.

    ``params`` overrides params.yaml in every scratch params file (and in the repro clone's) before a section's own
    settings go on top; ``groups`` is the n_groups of the backends rows, the cluster section and the gradient
    timings; ``common`` the sampler settings of every backends row but ``default``; ``grad_repeats`` x
    ``grad_inner`` the direct gradient timings, ``floor_repeats`` x ``floor_number`` the NumPy floor's;
    ``nuts_groups`` (the hierarchical fit at the committed ``hier_sampler``), ``per_group_groups`` (the flat and
    informed fits, in-process and on a LocalCluster), ``advi_groups`` and ``minibatch_groups`` the scaling section's
    sizes, ``report_groups`` and ``report_iterations`` its report point (ADVI fits of that many iterations);
    ``many_groups`` the overrides of the many-groups pipeline; ``point_limit_s`` the seconds a ``hier_nuts`` point may
    run (it is recorded as stopped past that); ``fixed_groups`` and ``fixed_limit_s`` the sizes and limit of the
    ``hier_nuts_fixed`` points (the committed ``hier_sampler`` with its length fixed).
    """

    params: dict = field(default_factory=dict)
    groups: int = 18
    seeds: tuple[int, ...] = SEEDS
    common: dict = field(default_factory=lambda: dict(COMMON))
    grad_repeats: int = 20
    grad_inner: int = 200
    floor_repeats: int = 20
    floor_number: int = 2000
    cluster_repeats: int = 2
    nuts_groups: tuple[int, ...] = (18, 60, 200, 1000)
    per_group_groups: int = 1000
    point_limit_s: float = 1800.0  # past 30 min a hierarchical NUTS point is stopped and recorded as too slow
    fixed_groups: tuple[int, ...] = (1000,)  # where the default run-length control runs past point_limit_s
    fixed_limit_s: float = 4200.0  # 1000 groups x 2 chains x 1500 iterations: ~45 min on 2 cores, with margin
    advi_groups: tuple[int, ...] = (18, 60, 200)
    minibatch_groups: tuple[int, ...] = (18, 60, 200, 1000)
    report_groups: int = 200
    report_iterations: int = 200
    many_groups: dict = field(default_factory=lambda: MANY_GROUPS)


FULL = Sizes()

# Tiny data and short fits that keep every code path of the full settings: run-length control and restarts in the
# `default` row (max_draws twice draws), per-group refits, the NumPy floor, a two-size scaling slope
# (nutpie's, the cheapest fit).
_TINY_FIT = {"tune": 20, "draws": 20, "max_draws": 40, "advi": {"iterations": 50}}
SMOKE = Sizes(
    params={"data": {"n_samples": 40}, "sampler": _TINY_FIT, "hier_sampler": _TINY_FIT,
            "prior": {"draws_per_sample": 2}, "transfer": {"tune": 20, "sizes": [2, 4], "refit_sizes": [2]},
            "report": {"grid_size": 12, "surface_draws": 20}},
    groups=3,
    seeds=(1,),
    common={"chains": 2, "tune": 20, "draws": 20},
    grad_repeats=2,
    grad_inner=5,
    floor_repeats=1,
    floor_number=10,
    cluster_repeats=1,
    nuts_groups=(2, 3),
    fixed_groups=(2,),
    per_group_groups=3,
    advi_groups=(3,),
    minibatch_groups=(3,),
    report_groups=3,
    report_iterations=50,
    many_groups=overridden(MANY_GROUPS, {
        "n_groups": 3,
        "hier_sampler": {"draws": 20, "advi": {"iterations": 50, "minibatch_size": 20}},
    }),
)
