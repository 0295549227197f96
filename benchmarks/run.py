"""`make bench`: backends side by side, the NumPy gradient floor, a warm `dvc repro`, scaling.

Every fit runs through the real stage scripts (``stages/*.py``) in a scratch
directory, as `dvc repro` would run them, each in its own process so that its
wall time and peak memory (``ru_maxrss`` from ``wait4``) are its own. Results go
to ``reports/benchmark.json``; a table is printed at the end. How much each section
measures is :mod:`benchmarks.sizes`'s; ``--smoke`` runs every row and section at tiny
sizes into another file (``--out``), to check that they run (tests/test_benchmarks.py).

Definitions (also written into the JSON under ``definitions``):
- ``wall_s``: compile + sampling seconds of the fit (from ``timings/*.json``);
  ``process_s`` is the whole stage process (imports, data, evaluation, writing).
- ``us_per_grad``: one log-density + gradient evaluation of the default
  hierarchical model in the form the backend samples (nutpie: :mod:`hbnn.density.kernel`), timed directly (minimum
  over repeats). ``sampler_us_per_grad`` is sampling seconds / leapfrog steps,
  sampler overhead included, where the backend reports its tuning steps.
- ``min_ess_bulk``: minimum bulk ESS over the group sds and the function-space
  test probabilities of every group; ``ess_per_s = min_ess_bulk / wall_s``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from benchmarks.sizes import (  # noqa: F401  (COMMON, SEEDS, MANY_GROUPS_SCHEDULER: read from here too)
    COMMON,
    FULL,
    MANY_GROUPS,
    MANY_GROUPS_SCHEDULER,
    SEEDS,
    SMOKE,
    Sizes,
    overridden,
)

_overridden = overridden  # the name tests/test_bad_inputs.py imports

ROOT = Path(__file__).resolve().parents[1]
NUTS_BACKENDS = ("nutpie", "pymc", "numpyro", "blackjax")
# Rows of the backends table: name -> sampler settings on top of the sizes' common ones.
VARIANTS = {  # None: the committed hier_sampler (the default configuration)
    "default": None,
    **{b: {"backend": b} for b in NUTS_BACKENDS},
    "nutpie_low_rank": {"backend": "nutpie", "mass_matrix": "low_rank"},
}
DEFINITIONS = {
    "wall_s": "compile + sampling seconds of the hierarchical fit",
    "process_s": "seconds of the whole fit_hier stage process",
    "compile_s": "model compilation seconds (null where the backend compiles inside sampling: pymc, JAX)",
    "grad_evals": "leapfrog steps over tuning and draws, both chains (JAX bridge: draws only, see grad_evals_cover)",
    "us_per_grad": "direct timing of the logp+gradient the backend samples (nutpie: the hand-written one of "
                   "hbnn.density.kernel), min over repeats",
    "sampler_us_per_grad": "sampling seconds x parallel chains / grad_evals (sampler overhead included)",
    "min_ess_bulk": "min bulk ESS over group sds and function-space test probabilities",
    "ess_per_s": "min_ess_bulk / wall_s",
    "ess_per_s_fn": "min bulk ESS of every group's test-point probabilities / wall_s",
    "ess_per_s_group_sd": "min bulk ESS of the group sds / wall_s",
    "time_to_converged_s": "wall_s x 400 / min_ess_bulk: seconds until every quantity has ESS 400 "
                           "(ESS linear in draws)",
    "speedup_vs_pymc": "ess_per_s / ess_per_s of PyMC's default NUTS (_fn, _group_sd: the same per figure); only "
                       "where the row and PyMC's were measured in the same run (measured_utc and commit equal)",
    "measured_utc": "when the run that measured the row (or section, under `measured`) started, UTC",
    "commit": "git commit of the code measured (`git rev-parse HEAD`; -dirty: with uncommitted changes to tracked "
              "files other than reports/benchmark.json)",
    "runs": "every figure is the median over sampler seeds 1, 2, 3; runs holds each seed's",
    "cluster": "the fit_flat stage process on the default data, in-process and with HBNN_DASK_SCHEDULER=local:2 "
               "(median of 2 runs each); speedup = serial / cluster seconds; identical_metrics: the metrics files "
               "are byte-identical",
    "hier_nuts": "scaling: the fit_hier stage at the committed hier_sampler (run-length control and restarts on) at "
                 "each number of groups; seconds = compile + sampling; draws per chain at the end; a point whose "
                 "typical estimate (hbnn.pipeline.budget) is past the point limit is not run: skipped says why, "
                 "estimated_minutes what the budget expects; error: a point that failed or was stopped "
                 "(seconds_run: after how long; warnings: up to 20 of the stage's warning lines, a restart's reason "
                 "among them; last_line: its last line of standard error)",
    "hier_nuts_fixed": "scaling: as hier_nuts, with the committed hier_sampler's length fixed (max_draws 0, restarts "
                       "0: tune + draws iterations per chain, whether or not every group meets the bar), at sizes "
                       "where run-length control and restarts make the default run past the point limit: what those "
                       "iterations cost, against the budget's estimate for the same settings (tests/test_budget.py)",
    "bench_seconds": "seconds of the run that last wrote this file, over the sections it ran",
    "steps_per_iteration": "leapfrog steps (gradients) per NUTS iteration: grad_evals / (chains x (tune x (1 + "
                           "restarts) + draws))",
    "us_per_grad_per_group": "sampler_us_per_grad / n_groups: the gradient's cost per group",
    "chain_steps": "each chain's leapfrog steps over the draws kept: a chain with fewer reaches the last look first "
                   "and draws on past it, work the trace does not keep (1 - mean / max: that share of the draws' "
                   "core time)",
    "per_group_nuts": "scaling: the fit_flat and fit_informed stage processes at the committed sampler, in-process and "
                      "with HBNN_DASK_SCHEDULER=local:2; the informed prior from the hier_nuts fit of the same data",
    "many_groups": "every stage process of the pipeline, report included, at MANY_GROUPS (benchmarks/sizes.py): "
                   "seconds (summed over stages) and peak resident memory (the largest stage)",
}


# ----------------------------------------------------------------------------- processes
def _run(cmd: list[str], cwd: Path, limit_s: float | None = None, **env_extra: str) -> dict:
    """Run ``cmd`` (with ``env_extra`` in its environment); return its wall seconds and peak resident memory (MiB).
    Past ``limit_s`` seconds its process group is stopped; a failed or stopped process raises :class:`StageFailed`."""
    env = dict(os.environ, PYTHONHASHSEED="0", **env_extra)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        timer = threading.Timer(limit_s, os.killpg, (proc.pid, signal.SIGTERM)) if limit_s else None
        if timer:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            text = err.read().decode(errors="replace")
            over = f" stopped at the limit of {limit_s:g} s" if limit_s and seconds >= limit_s else ""
            raise StageFailed(f"{' '.join(cmd)} failed ({proc.returncode}){over}", text, seconds)
    return {"seconds": seconds, "peak_rss_mib": usage.ru_maxrss / 1024}


_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # hbnn's log lines start with their time
_WARNING = re.compile(r" WARNING | ERROR |^error: |\w+Warning: ")  # hbnn's log levels, its CLI, Python's warnings


class StageFailed(RuntimeError):
    """A stage process that failed or was stopped: ``headline`` says which and how, ``warnings`` its warning and
    error lines (hbnn's log, its ``error:`` line, Python's warnings; each text once, its first time, in order: a
    heartbeat's repeats would hide them in the tail), ``tail`` the end of its standard error, ``seconds`` how long it
    ran."""

    def __init__(self, headline: str, stderr: str, seconds: float):
        self.headline, self.seconds, self.tail = headline, seconds, stderr[-3000:]
        first: dict[str, str] = {}
        for line in stderr.splitlines():
            if _WARNING.search(line):
                first.setdefault(_STAMP.sub("", line), line)
        self.warnings = list(first.values())
        super().__init__("\n".join([f"{headline}:", *self.warnings[:20], "...", self.tail]))

    def record(self) -> dict:
        """What a benchmark row keeps of the failure: the headline, the seconds, up to 20 warning lines and the last
        line of standard error (each line at most 400 characters)."""
        return {"error": self.headline, "seconds_run": round(self.seconds, 1),
                "warnings": [line[-400:] for line in self.warnings[:20]],
                "last_line": (self.tail.strip().splitlines() or [""])[-1][-400:]}


@contextlib.contextmanager
def _scheduler(value: str):
    """``HBNN_DASK_SCHEDULER=value`` for the stage processes started inside (``""``: in-process), as it was after."""
    before = os.environ.get("HBNN_DASK_SCHEDULER")
    os.environ["HBNN_DASK_SCHEDULER"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HBNN_DASK_SCHEDULER")
        else:
            os.environ["HBNN_DASK_SCHEDULER"] = before


def _stage(stage: str, params: Path, *args: str, limit_s: float | None = None) -> dict:
    return _run([sys.executable, str(ROOT / "stages" / f"{stage}.py"), "--params", str(params), *args],
                params.parent, limit_s)


# The settings only the per-group fits take, off in a hierarchical fit made from `sampler`'s (SamplerParams.check):
# no run-length control (max_draws there is the per-group refit's, which PyMC, BlackJAX and ADVI do not take for the
# joint fit), no refit at a higher target_accept, no restarts.
_HIER_OFF = {"max_draws": 0, "refit_target_accept": 0.0, "restarts": 0}


def _params(workdir: Path, n_groups: int, sampler: dict | None, base: dict | None = None, **extra) -> Path:
    """params.yaml with ``n_groups`` and ``sampler`` settings for every fit stage (``None``: as committed).

    ``base`` overrides params.yaml first (:attr:`benchmarks.sizes.Sizes.params`); ``sampler`` goes on top of the
    per-group ``sampler`` section, and ``hier_sampler`` becomes that section with :data:`_HIER_OFF`, so every fit runs
    at the same settings, the hierarchical one of fixed length; ``extra`` overrides whole sections last.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    raw = overridden(yaml.safe_load((ROOT / "params.yaml").read_text()), base or {})
    raw["n_groups"] = n_groups
    if sampler is not None:
        raw["sampler"] = overridden(raw["sampler"], sampler)
        raw["hier_sampler"] = {**raw["sampler"], **_HIER_OFF}
    raw = overridden(raw, extra)
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _fit(stage: str, params: Path, stem: str, *extra: str, limit_s: float | None = None) -> dict:
    """Run a fit stage (stopped past ``limit_s`` seconds); return its process cost, metrics and timings."""
    run = _stage(stage, params, "--tasks-path", "data/tasks.nc", *extra, "--trace-out", f"traces/{stem}.nc",
                 "--metrics-out", f"metrics/{stem}.json", "--timing-out", f"timings/{stem}.json", limit_s=limit_s)
    d = params.parent
    # the complete metrics (group sds, function-space extremes): the headline file holds DESIGN's keys only
    return {"run": run, "metrics": json.loads((d / "metrics" / "detail" / f"{stem}.json").read_text()),
            "timing": json.loads((d / "timings" / f"{stem}.json").read_text())}


def _draw_steps(trace: Path) -> int:
    """Leapfrog steps over the draws a trace keeps, every chain's (0 where it has no ``n_steps``)."""
    return sum(chain_steps(trace))


def chain_steps(trace: Path) -> list[int]:
    """Each chain's leapfrog steps over the draws a trace keeps (its ``sample_stats``, summed over every other
    dimension: a per-group trace's groups too; none where it has no ``n_steps``)."""
    import xarray as xr

    with xr.open_dataset(trace, group="sample_stats") as stats:
        if "n_steps" not in stats:
            return []
        steps = stats["n_steps"]
        return [int(v) for v in steps.sum([d for d in steps.dims if d != "chain"]).values]


# ----------------------------------------------------------------------------- gradients
def _default_model(overrides: dict | None = None):
    """The hierarchical model of params.yaml (with ``overrides``), its tasks and params."""
    from hbnn.config_read import parse_params
    from hbnn.data.moons import make_moons_tasks
    from hbnn.data.spec import DataSpec
    from hbnn.data.tasks import Tasks
    from hbnn.model.builders import build_hierarchical_model

    params = parse_params(overridden(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides or {}))
    tasks = Tasks(make_moons_tasks(DataSpec.of(params)))
    pad = tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tasks.group_names, tasks.features,
                                     params.model.hidden_layers)
    return model, tasks, params


def _min_time(fn, x, repeats: int, inner: int) -> float:
    """Minimum over ``repeats`` of the mean seconds of ``inner`` calls."""
    fn(x)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn(x)
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def direct_us_per_grad(backend: str, repeats: int = 20, inner: int = 200, overrides: dict | None = None) -> float:
    """Microseconds per logp+gradient of the default hierarchical model (params.yaml with ``overrides``) as
    ``backend`` compiles it."""
    model, tasks, params = _default_model(overrides)
    x = model.initial_point()
    rng = np.random.default_rng(0)
    flat = np.concatenate([np.ravel(v) for v in x.values()]) + rng.normal(0, 0.1, sum(np.size(v) for v in x.values()))
    if backend == "nutpie":  # nutpie samples the hand-written log density (hbnn.density.kernel), not PyTensor's
        from hbnn.density.densities import HierarchicalDensity

        pad, m = tasks.padded("train"), params.model
        density = HierarchicalDensity(pad.X, pad.y, pad.counts, tuple(m.hidden_layers), m.bias, m.likelihood,
                                      m.noise_sd)
        starts = np.concatenate([[0], np.cumsum([np.size(v) for v in x.values()])[:-1]])
        buf = density.pack({name: int(at) for name, at in zip(x, starts, strict=True)})
        grad = np.empty(flat.size)
        logp_grad = density.logp_grad()  # the passes written out for this network, as nutpie's callback calls

        def fn(theta):
            return logp_grad(theta, grad, buf)
    elif backend == "pymc":
        f = model.logp_dlogp_function(ravel_inputs=True)
        f._pytensor_function.trust_input = True
        fn = f._pytensor_function
    else:
        import jax

        jax.config.update("jax_enable_x64", True)
        from pymc.sampling.jax import get_jaxified_logp

        logp = get_jaxified_logp(model, negative_logp=False)
        sizes = [np.size(v) for v in x.values()]
        shapes = [np.shape(v) for v in x.values()]
        splits = np.cumsum(sizes)[:-1]

        def flat_logp(theta):
            parts = jax.numpy.split(theta, splits)
            return logp([p.reshape(s) for p, s in zip(parts, shapes, strict=True)])

        grad = jax.jit(jax.value_and_grad(flat_logp))

        def fn(theta):
            value, g = grad(theta)
            g.block_until_ready()
            return value, g

        flat = jax.numpy.asarray(flat)
    return 1e6 * _min_time(fn, flat, repeats, inner)


def numpy_floor_us_per_grad(repeats: int = 20, number: int = 2000) -> float:
    """The hand-written NumPy log-density gradient (benchmarks/numpy_floor.py), same model, same timing."""
    from benchmarks import numpy_floor

    return numpy_floor.us_per_grad(numpy_floor.default_floor(), repeats=repeats, number=number)


# ----------------------------------------------------------------------------- sections
def _hier_run(work: Path, name: str, sampler: dict | None, seed: int, sizes: Sizes = FULL) -> dict:
    """One fit_hier run at these settings and sampler seed: costs and the two ESS figures."""
    workdir = work / f"{name}_seed{seed}"
    if sampler is None:  # the committed hier_sampler, only its seed changed
        params = _params(workdir, sizes.groups, None, sizes.params, hier_sampler={"seed": seed})
    else:  # the backends table's common settings, whatever params.yaml's per-group sampler says
        params = _params(workdir, sizes.groups, {**sizes.common, **sampler, "seed": seed}, sizes.params)
    _stage("make_data", params, "--out", "data/tasks.nc")
    print(f"bench: fit_hier {name} seed {seed} ...", flush=True)
    r = _fit("fit_hier", params, "hier")
    t, m = r["timing"]["sampling"], r["metrics"]
    backend = r["timing"]["backend"]
    compile_s = t["compile_seconds"] if backend == "nutpie" else None
    wall = t["seconds"] + (compile_s or 0.0)
    draws_only = backend in ("numpyro", "blackjax")
    ess_sd = min(v["ess_bulk"] for v in m["sampling"]["group_sd"].values())
    ess_fn = m["sampling"]["min_ess_bulk_fn"]
    return {
        "seed": seed, "backend": backend, "wall_s": wall, "sampling_s": t["seconds"],
        "process_s": r["run"]["seconds"], "peak_rss_mib": r["run"]["peak_rss_mib"], "compile_s": compile_s,
        "grad_evals": _draw_steps(params.parent / "traces" / "hier.nc") if draws_only else t["grad_evals"],
        "grad_evals_cover": "draws only" if draws_only else "tuning and draws",
        "sampler_us_per_grad": None if draws_only else t["us_per_grad"],
        "min_ess_bulk": m["sampling"]["min_ess_bulk"], "min_ess_bulk_fn": ess_fn, "min_ess_bulk_group_sd": ess_sd,
        "ess_per_s": m["sampling"]["min_ess_bulk"] / wall, "ess_per_s_fn": ess_fn / wall,
        "ess_per_s_group_sd": ess_sd / wall,
        # Draws scale ESS linearly for a mixing chain: seconds until the smallest ESS reaches 400.
        "time_to_converged_s": wall * 400 / m["sampling"]["min_ess_bulk"],
        "divergences": m["sampling"]["divergences"], "max_rhat": m["sampling"]["max_rhat"],
        "groups_not_converged": m["sampling"]["groups_not_converged"],
        "test_accuracy": m["test"]["accuracy"],
    }


MEDIAN_KEYS = ("wall_s", "min_ess_bulk", "min_ess_bulk_fn", "min_ess_bulk_group_sd", "ess_per_s", "ess_per_s_fn",
               "ess_per_s_group_sd", "time_to_converged_s", "divergences", "groups_not_converged", "test_accuracy")


def run_stamp() -> dict:
    """When this run started (UTC, ISO 8601) and the git commit of the code it measures (``-dirty``: with
    uncommitted changes to tracked files other than the report this file writes, :data:`REPORT`, which a run
    before it may have changed; ``unknown`` outside a git checkout): rows with equal stamps come from one run."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                                         f":!{REPORT.relative_to(ROOT)}") else "")
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"measured_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": commit}


def backends(work: Path, variants=VARIANTS, sizes: Sizes = FULL, stamp: dict | None = None) -> dict:
    """Every variant at ``sizes.seeds`` sampler seeds; the figures are medians over seeds (``runs`` keeps each).
    Every row carries ``stamp`` (:func:`run_stamp`; a new one if not given) and its ratios to PyMC's row."""
    stamp = stamp or run_stamp()
    out, direct = {}, {}
    for name, sampler in variants.items():
        runs = [_hier_run(work, name, sampler, seed, sizes) for seed in sizes.seeds]
        backend = runs[0]["backend"]
        if backend not in direct and backend != "advi":  # the gradient does not depend on the mass matrix
            direct[backend] = direct_us_per_grad(backend, sizes.grad_repeats, sizes.grad_inner,
                                                 {**sizes.params, "n_groups": sizes.groups})
        out[name] = {**stamp, "settings": sampler or "hier_sampler as committed", "runs": runs,
                     "us_per_grad": direct.get(backend),
                     **{k: float(np.median([r[k] for r in runs])) for k in MEDIAN_KEYS},
                     "grad_evals": int(np.median([r["grad_evals"] for r in runs])),
                     "compile_s": runs[0]["compile_s"]}
        print(f"bench: {name}: {json.dumps({k: out[name][k] for k in MEDIAN_KEYS})}", flush=True)
    return with_speedups(out)


def _kept_rows(previous: dict, fresh: dict) -> dict:
    """The backends table after ``--variants``: ``fresh`` rows and the ``previous`` ones not run, each row whole as
    its own run measured it (its stamp says which)."""
    kept = {name: row for name, row in previous.items()
            if name not in fresh and name in VARIANTS}  # a row of a variant since removed or renamed goes
    return {**kept, **fresh}


_RATES = ("ess_per_s", "ess_per_s_fn", "ess_per_s_group_sd")


def _same_run(a: dict, b: dict) -> bool:
    """Whether rows ``a`` and ``b`` carry one run's stamp (:func:`run_stamp`); an unstamped row matches none."""
    return a.get("measured_utc") is not None and all(a.get(k) == b.get(k) for k in ("measured_utc", "commit"))


def with_speedups(rows: dict) -> dict:
    """``rows`` with every row's ESS/s figures divided by PyMC's row's, as ``speedup_vs_pymc*``, where the two were
    measured in the same run; a row without a PyMC row of its run has none (not a ratio of two runs' figures)."""
    pymc = rows.get("pymc")
    for b in rows.values():
        for key in _RATES:
            ratio = f"speedup_vs_pymc{key[len('ess_per_s'):]}"
            if pymc is not None and _same_run(b, pymc):
                b[ratio] = b[key] / pymc[key]
            else:
                b.pop(ratio, None)
    return rows


def repro(work: Path, base: dict | None = None) -> dict:
    """`dvc repro --force` of the default pipeline in a clone of the committed repo (compile caches warm); ``base``
    overrides the clone's params.yaml (:attr:`benchmarks.sizes.Sizes.params`)."""
    clone = work / "repro"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    if base:
        raw = yaml.safe_load((clone / "params.yaml").read_text())
        (clone / "params.yaml").write_text(yaml.safe_dump(overridden(raw, base)))
    env_bin = str(Path(sys.executable).parent)
    run = _run([str(Path(env_bin) / "dvc"), "repro", "--force"], clone, PATH=f"{env_bin}:{os.environ['PATH']}")
    stages = {}
    for stem in ("flat", "hier", "informed"):
        t = json.loads((clone / "timings" / f"{stem}.json").read_text())["sampling"]
        stages[stem] = {"sampling_s": t["seconds"], "compile_s": t["compile_seconds"]}
    return {"repro_s": run["seconds"], "repro_peak_rss_mib": run["peak_rss_mib"], "repro_stages": stages}


_NO_LIMITS = {"max_memory_gib": 1e6, "max_minutes": 1e6}
# The committed hier_sampler with its length fixed (tune + draws per chain, no further look, no restart): what that many
# iterations cost, measured at sizes where run-length control and restarts make the default run past the point limit.
_HIER_FIXED = {"max_draws": 0, "restarts": 0}
_HIER_NUTS_ROWS = {"hier_nuts": {}, "hier_nuts_fixed": _HIER_FIXED}  # each row's overrides of hier_sampler
SCALING_ROWS = ("hier_nuts", "hier_nuts_fixed", "per_group_nuts", "hier_advi", "hier_advi_minibatch", "report")


def _trace_draws(trace: Path) -> int:
    """Draws per chain in a trace's posterior (read lazily: only the dimension)."""
    import xarray as xr

    with xr.open_dataset(trace, group="posterior") as posterior:
        return int(posterior.sizes["draw"])


def _typical_minutes(stage: str, params: Path) -> float:
    """The budget's typical minutes for fit ``stage`` with ``params`` on the tasks made beside them
    (:func:`hbnn.fitting.common.estimate_fit`, the estimate a fit stage enforces its limits with)."""
    from hbnn.config_read import load_params
    from hbnn.fitting.common import estimate_fit
    from hbnn.pipeline.stages import load_run_tasks

    p = load_params(params)
    return estimate_fit(stage, p, load_run_tasks(params.parent / "data" / "tasks.nc", p)).minutes


def hier_nuts_point(work: Path, n: int, sizes: Sizes = FULL, stamp: dict | None = None,
                    row: str = "hier_nuts") -> dict:
    """The hierarchical fit at ``n`` groups with the committed ``hier_sampler``: seconds, leapfrog steps per
    iteration, microseconds per gradient and per group, peak memory, and whether every group meets the convergence
    criterion.

    ``row`` ``hier_nuts``: as committed (run-length control and restarts on), stopped past ``sizes.point_limit_s``;
    ``hier_nuts_fixed``: of fixed length (:data:`_HIER_FIXED`), stopped past ``sizes.fixed_limit_s``.
    """
    limit_s = sizes.fixed_limit_s if row == "hier_nuts_fixed" else sizes.point_limit_s
    # limits off: the point measures what the fit costs, where the budget's worst case would refuse it
    params = _params(work / f"{row}_{n}", n, None, sizes.params, limits=_NO_LIMITS,
                     hier_sampler=_HIER_NUTS_ROWS[row])
    _stage("make_data", params, "--out", "data/tasks.nc")
    expected = _typical_minutes("fit_hier", params)
    if expected * 60 > limit_s:  # a point the budget expects past the limit is not spent to learn it
        reason = (f"not run: hbnn.pipeline.budget expects {expected:.0f} min (its typical estimate, within 2x of the "
                  f"measured points), past the point limit of {limit_s / 60:g} min")
        print(f"bench: scaling {row} n_groups={n} {reason}", flush=True)
        return {**(stamp or run_stamp()), "n_groups": n, "skipped": reason, "estimated_minutes": round(expected, 1),
                "hier_trace": ""}
    print(f"bench: scaling {row} n_groups={n} (expected ~{expected:.0f} min) ...", flush=True)
    try:
        r = _fit("fit_hier", params, "hier", limit_s=limit_s)
    except StageFailed as e:  # past the limit, killed (out of memory) or failed: the point says so
        print(f"bench: scaling {row} n_groups={n} failed: {e}", flush=True)
        return {**(stamp or run_stamp()), "n_groups": n, **e.record(), "hier_trace": ""}
    t, s = r["timing"]["sampling"], r["metrics"]["sampling"]
    hs = yaml.safe_load(params.read_text())["hier_sampler"]
    draws = _trace_draws(params.parent / "traces" / "hier.nc")
    restarts = int(s.get("restarts") or 0)
    iterations = hs["chains"] * (hs["tune"] * (1 + restarts) + draws)  # a restart tunes again
    return {**(stamp or run_stamp()), "n_groups": n, "hier_sampler": hs,
            "seconds": t["seconds"] + t["compile_seconds"], "sampling_s": t["seconds"],
            "compile_s": t["compile_seconds"], "process_s": r["run"]["seconds"],
            "peak_rss_mib": r["run"]["peak_rss_mib"], "draws": draws, "tune": hs["tune"], "restarts": restarts,
            "grad_evals": t["grad_evals"], "steps_per_iteration": t["grad_evals"] / iterations,
            "sampler_us_per_grad": t["us_per_grad"], "us_per_grad_per_group": t["us_per_grad"] / n,
            "chain_steps": chain_steps(params.parent / "traces" / "hier.nc"),
            "groups_not_converged": s["groups_not_converged"], "sds_not_converged": s["sds_not_converged"],
            "max_rhat": s["max_rhat"], "min_ess_bulk": s["min_ess_bulk"], "divergences": s["divergences"],
            "test_accuracy": r["metrics"]["test"]["accuracy"], "hier_trace": str(params.parent / "traces/hier.nc")}


def per_group_nuts(work: Path, hier_trace: Path, n: int, scheduler: str, sizes: Sizes = FULL,
                   stamp: dict | None = None, hier_sampler: dict | None = None) -> dict:
    """The flat and informed per-group NUTS fits (the committed ``sampler``) at ``n`` groups, with
    ``HBNN_DASK_SCHEDULER=scheduler`` (``""``: in-process); the informed prior comes from ``hier_trace`` (a
    hierarchical fit of the same data, with the committed ``hier_sampler`` overridden by ``hier_sampler``). Each
    fit's process seconds, sampling seconds, peak memory and convergence."""
    work = work / f"per_group_{n}_{scheduler or 'serial'}"
    params = _params(work, n, None, sizes.params, limits=_NO_LIMITS, hier_sampler=hier_sampler or {})
    _stage("make_data", params, "--out", "data/tasks.nc")
    _stage("derive_prior", params, "--hier-trace", str(hier_trace), "--prior-out", "priors/informed.nc",
           "--metrics-out", "metrics/prior.json")
    out = {**(stamp or run_stamp()), "n_groups": n, "scheduler": scheduler or "in-process"}
    with _scheduler(scheduler):
        for stage, stem, extra in (("fit_flat", "flat", ()),
                                   ("fit_informed", "informed", ("--prior-path", "priors/informed.nc"))):
            print(f"bench: scaling per-group {stem} n_groups={n} ({out['scheduler']}) ...", flush=True)
            try:
                r = _fit(stage, params, stem, *extra)
            except StageFailed as e:
                out[stem] = e.record()
                continue
            t, s = r["timing"]["sampling"], r["metrics"]["sampling"]
            out[stem] = {"process_s": r["run"]["seconds"], "sampling_s": t["seconds"],
                         "compile_s": t.get("compile_seconds"), "peak_rss_mib": r["run"]["peak_rss_mib"],
                         "groups_not_converged": s["groups_not_converged"], "max_rhat": s["max_rhat"],
                         "min_ess_bulk": s["min_ess_bulk"], "divergences": s["divergences"],
                         "test_accuracy": r["metrics"]["test"]["accuracy"]}
    return out


def _advi_hier_trace(work: Path, n: int, sizes: Sizes, hier_sampler: dict) -> Path:
    """A hierarchical posterior of ``n`` groups with ``hier_sampler`` (minibatch ADVI: minutes where NUTS takes an
    hour), for the per-group fits' informed prior."""
    params = _params(work / f"hier_advi_prior_{n}", n, None, sizes.params, limits=_NO_LIMITS,
                     hier_sampler=hier_sampler)
    _stage("make_data", params, "--out", "data/tasks.nc")
    print(f"bench: scaling per-group: the hierarchical posterior of {n} groups by ADVI ...", flush=True)
    _fit("fit_hier", params, "hier")
    return params.parent / "traces" / "hier.nc"


def scaling(work: Path, sizes: Sizes = FULL, rows=SCALING_ROWS, stamp: dict | None = None, save=None) -> dict:
    """The scaling rows in ``rows`` (:data:`SCALING_ROWS`), every point stamped (:func:`run_stamp`).

    ``hier_nuts``: the hierarchical fit with the committed ``hier_sampler`` at ``sizes.nuts_groups`` groups
    (:func:`hier_nuts_point`), ``hier_nuts_fixed`` that fit of fixed length at ``sizes.fixed_groups``;
    ``per_group_nuts``: the flat and informed per-group fits at
    ``sizes.per_group_groups``, in-process and on a 2-worker LocalCluster (:func:`per_group_nuts`; the informed prior
    from that size's ``hier_nuts`` or ``hier_nuts_fixed`` fit, run here if neither is); ``hier_advi`` and
    ``hier_advi_minibatch``: ADVI, full batch and minibatch; ``report``: the report stage at
    ``sizes.report_groups``. ``save`` (if given) is called with the rows so far after every point.
    """
    save = save or (lambda rows_so_far: None)
    stamp = stamp or run_stamp()
    out: dict = {row: {} for row in rows}
    posteriors: dict[int, tuple[Path, str]] = {}  # each size's first hierarchical NUTS trace, and its row
    for row, groups in (("hier_nuts", sizes.nuts_groups), ("hier_nuts_fixed", sizes.fixed_groups)):
        if row not in rows:
            continue
        for n in groups:
            point = hier_nuts_point(work, n, sizes, stamp, row)
            if trace := point.pop("hier_trace"):
                posteriors.setdefault(n, (Path(trace), row))
            out[row][str(n)] = point
            save(out)
    if "per_group_nuts" in rows:
        n = sizes.per_group_groups
        if n in posteriors:
            trace, source = posteriors[n]
            hier = _HIER_NUTS_ROWS[source]
        else:  # the informed prior's cost does not depend on how its posterior was drawn
            source, hier = "minibatch ADVI", sizes.many_groups["hier_sampler"]
            trace = _advi_hier_trace(work, n, sizes, hier)
        out["per_group_nuts"][str(n)] = {
            how: {**per_group_nuts(work, trace, n, scheduler, sizes, stamp, hier), "prior_from": source}
            for how, scheduler in (("in_process", ""), ("local_cluster_2", "local:2"))}
        save(out)
    for key, batch, groups in (("hier_advi", 0, sizes.advi_groups),
                               ("hier_advi_minibatch", 500, sizes.minibatch_groups)):
        if key not in rows:
            continue
        for n in groups:
            params = _params(work / f"{key}_{n}", n, {"backend": "advi", "advi": {"minibatch_size": batch}},
                             sizes.params)
            _stage("make_data", params, "--out", "data/tasks.nc")
            print(f"bench: scaling {key} n_groups={n} ...", flush=True)
            r = _fit("fit_hier", params, "hier")
            t = r["timing"]["sampling"]
            out[key][str(n)] = {**stamp, "seconds": t["seconds"] + t["compile_seconds"],
                                "process_s": r["run"]["seconds"],
                                "peak_rss_mib": r["run"]["peak_rss_mib"],
                                "test_accuracy": r["metrics"]["test"]["accuracy"]}
            save(out)
    if "report" in rows:
        out["report"] = _report_point(work, sizes, stamp)
    return out


def _report_point(work: Path, sizes: Sizes, stamp: dict) -> dict:
    """The report stage at ``sizes.report_groups`` groups: seconds and peak memory.

    The traces hold the default draw counts (chains x draws), fitted by a short ADVI (``sizes.report_iterations``
    iterations per fit): the report's time and memory depend on the trace sizes, not on how the draws were made, and
    three NUTS fits of that many groups would take most of an hour."""
    n = sizes.report_groups
    params = _params(work / f"report_{n}", n, {"backend": "advi", "advi": {"iterations": sizes.report_iterations}},
                     sizes.params)
    _stage("make_data", params, "--out", "data/tasks.nc")
    print(f"bench: report at n_groups={n} ...", flush=True)
    _fit("fit_flat", params, "flat")
    _fit("fit_hier", params, "hier")
    _stage("derive_prior", params, "--hier-trace", "traces/hier.nc", "--prior-out", "priors/informed.nc",
           "--metrics-out", "metrics/prior.json")
    _fit("fit_informed", params, "informed", "--prior-path", "priors/informed.nc")
    run = _stage("report", params, "--tasks-path", "data/tasks.nc", "--flat-trace", "traces/flat.nc",
                 "--hier-trace", "traces/hier.nc", "--informed-trace", "traces/informed.nc",
                 "--prior-path", "priors/informed.nc", "--metrics-dir", "metrics", "--out-dir", "reports")
    return {str(n): {**stamp, "seconds": run["seconds"], "peak_rss_mib": run["peak_rss_mib"]}}


def _pipeline_stages() -> list[tuple[str, tuple[str, ...]]]:
    """Every stage of dvc.yaml with its arguments, in order (as ``tests/test_stages.py`` runs them)."""
    fit = {name: ("--tasks-path", "data/tasks.nc", "--trace-out", f"traces/{stem}.nc", "--metrics-out",
                  f"metrics/{stem}.json", "--timing-out", f"timings/{stem}.json")
           for name, stem in (("fit_flat", "flat"), ("fit_hier", "hier"))}
    return [
        ("make_data", ("--out", "data/tasks.nc")),
        ("fit_flat", fit["fit_flat"]),
        ("fit_hier", fit["fit_hier"]),
        ("derive_prior", ("--hier-trace", "traces/hier.nc", "--prior-out", "priors/informed.nc", "--metrics-out",
                          "metrics/prior.json")),
        ("fit_informed", ("--tasks-path", "data/tasks.nc", "--prior-path", "priors/informed.nc", "--trace-out",
                          "traces/informed.nc", "--metrics-out", "metrics/informed.json", "--timing-out",
                          "timings/informed.json")),
        ("transfer_prior", ("--tasks-path", "data/tasks.nc", "--trace-out", "traces/transfer/hier.nc",
                            "--prior-out", "priors/transfer.nc", "--metrics-out", "metrics/detail/transfer_prior.json",
                            "--timing-out", "timings/transfer_prior.json")),
        ("transfer_refit", ("--tasks-path", "data/tasks.nc", "--trace-dir", "traces/transfer/refit", "--metrics-out",
                            "metrics/detail/transfer_refit.json", "--timing-out", "timings/transfer_refit.json")),
        ("transfer", ("--tasks-path", "data/tasks.nc", "--hier-trace", "traces/transfer/hier.nc", "--prior-path",
                      "priors/transfer.nc", "--prior-metrics", "metrics/detail/transfer_prior.json",
                      "--refit-metrics", "metrics/detail/transfer_refit.json", "--flat-trace-out",
                      "traces/transfer/flat.nc", "--informed-trace-out", "traces/transfer/informed.nc",
                      "--metrics-out", "metrics/transfer.json", "--plot-out", "reports/plots/transfer.csv",
                      "--timing-out", "timings/transfer.json")),
        ("report", ("--tasks-path", "data/tasks.nc", "--flat-trace", "traces/flat.nc", "--hier-trace",
                    "traces/hier.nc", "--informed-trace", "traces/informed.nc", "--prior-path", "priors/informed.nc",
                    "--metrics-dir", "metrics", "--out-dir", "reports")),
    ]


def many_groups(work: Path, overrides: dict = MANY_GROUPS, scheduler: str = MANY_GROUPS_SCHEDULER,
                base: dict | None = None) -> dict:
    """The whole pipeline, report included, at ``overrides`` (:data:`benchmarks.sizes.MANY_GROUPS`) on top of
    params.yaml with ``base`` (:attr:`benchmarks.sizes.Sizes.params`), with ``HBNN_DASK_SCHEDULER=scheduler``:
    each stage process's seconds and peak resident memory (``wait4`` reports the largest of the stage process
    and its reaped children, so a LocalCluster worker counts on its own, not summed with the others)."""
    work.mkdir(parents=True, exist_ok=True)
    params = work / "params.yaml"
    raw = overridden(yaml.safe_load((ROOT / "params.yaml").read_text()), base or {})
    params.write_text(yaml.safe_dump(overridden(raw, overrides)))
    stages = {}
    with _scheduler(scheduler):
        for stage, args in _pipeline_stages():
            print(f"bench: many groups: {stage} ...", flush=True)
            stages[stage] = _stage(stage, params, *args)
            print(f"bench: many groups: {stage} {stages[stage]['seconds']:.1f}s, "
                  f"{stages[stage]['peak_rss_mib']:.0f} MiB", flush=True)
    metrics = {m: json.loads((work / "metrics" / f"{m}.json").read_text()) for m in ("flat", "hier", "informed")}
    return {
        "settings": overrides,
        "scheduler": scheduler,
        "stages": stages,
        "seconds": sum(r["seconds"] for r in stages.values()),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in stages.values()),
        "report_html_mib": (work / "reports" / "report.html").stat().st_size / 2**20,
        "test_accuracy": {m: v["test"].get("accuracy") for m, v in metrics.items()},
        # the status box's verdict: groups missing the bar and (ADVI) loss curves still falling
        "convergence": {m: {k: v["sampling"].get(k) for k in ("groups_not_converged", "advi_still_falling",
                                                                "max_rhat", "min_ess_bulk")}
                        for m, v in metrics.items()},
    }


def cluster_speedup(work: Path, sizes: Sizes = FULL) -> dict:
    """The flat stage on the default data (``sizes.groups`` groups) in-process and on a 2-worker Dask LocalCluster
    (process seconds, median of ``sizes.cluster_repeats`` runs)."""
    params = _params(work, sizes.groups, None, sizes.params)
    repeats = sizes.cluster_repeats
    _stage("make_data", params, "--out", "data/tasks.nc")
    out: dict = {}
    for where, scheduler in (("serial", ""), ("local_cluster_2", "local:2")):
        with _scheduler(scheduler):
            runs = [_fit("fit_flat", params, f"flat_{where}") for _ in range(repeats)]
        out[where] = {"seconds": float(np.median([r["run"]["seconds"] for r in runs])),
                      "peak_rss_mib": max(r["run"]["peak_rss_mib"] for r in runs)}
        print(f"bench: flat stage {where}: {out[where]['seconds']:.1f}s", flush=True)
    out["speedup"] = out["serial"]["seconds"] / out["local_cluster_2"]["seconds"]
    out["identical_metrics"] = all((work / "metrics" / f"flat_{w}.json").read_bytes()
                                   == (work / "metrics" / "flat_serial.json").read_bytes()
                                   for w in ("serial", "local_cluster_2"))
    return out


def _linearity(points: dict) -> dict:
    """Seconds per group at each size, and the log-log slope between the smallest and largest size."""
    points = {k: v for k, v in points.items() if "seconds" in v}  # a point that failed says why, with no time
    sizes = sorted(int(k) for k in points)
    per_group = {str(n): points[str(n)]["seconds"] / n for n in sizes}
    if len(sizes) < 2:
        return {"seconds_per_group": per_group}
    a, b = sizes[0], sizes[-1]
    slope = np.log(points[str(b)]["seconds"] / points[str(a)]["seconds"]) / np.log(b / a)
    return {"seconds_per_group": per_group, "loglog_slope": float(slope)}


def _table(result: dict) -> str:
    rows = [f"{'backend (median of seeds)':26} {'wall_s':>7} {'ESSfn':>6} {'ESSsd':>6} {'fn/s':>6} {'sd/s':>6} "
            f"{'x pymc fn':>9} {'x pymc sd':>9} {'t_conv_s':>8} {'div':>5} {'not conv':>8} {'test acc':>8}"]
    nan = float("nan")
    for name, b in result["backends"].items():
        rows.append(f"{name:26} {b['wall_s']:7.1f} {b['min_ess_bulk_fn']:6.0f} {b['min_ess_bulk_group_sd']:6.0f} "
                    f"{b['ess_per_s_fn']:6.2f} {b['ess_per_s_group_sd']:6.2f} {b.get('speedup_vs_pymc_fn', nan):9.2f} "
                    f"{b.get('speedup_vs_pymc_group_sd', nan):9.2f} {b['time_to_converged_s']:8.0f} "
                    f"{b['divergences']:5.0f} {b['groups_not_converged']:8.0f} {b['test_accuracy']:8.4f}")
    rows.append(f"numpy floor: {result['numpy_floor_us_per_grad']:.1f} us/grad; "
                f"repro_s: {result.get('repro_s', float('nan')):.1f}")
    scaling = result.get("scaling", {})
    for key, points in scaling.items():
        if key in ("linearity", "per_group_nuts"):
            continue
        cells = ", ".join(f"{n}: {points[n]['seconds']:.1f}s/{points[n]['peak_rss_mib']:.0f}MiB" if "seconds" in
                          points[n] else f"{n}: {_not_measured(points[n])}" for n in sorted(points, key=int))
        slope = scaling.get("linearity", {}).get(key, {}).get("loglog_slope")
        if slope is not None:
            cells += f" (log-log slope {slope:.2f})"
        rows.append(f"scaling {key}: {cells}")
        if key in ("hier_nuts", "hier_nuts_fixed"):
            rows.extend(f"  {n} groups: {p['draws']} draws, {p['steps_per_iteration']:.0f} steps an iteration, "
                        f"{p['us_per_grad_per_group']:.2f} us/grad a group, {p['groups_not_converged']} groups "
                        f"missing the bar" for n, p in sorted(points.items(), key=lambda item: int(item[0]))
                        if "seconds" in p)
    for n, point in scaling.get("per_group_nuts", {}).items():
        for how, fits in ((k, v) for k, v in point.items() if isinstance(v, dict)):
            rows.append(f"per-group NUTS at {n} groups ({how}): " + ", ".join(
                f"{stem} {fits[stem]['process_s']:.0f}s/{fits[stem]['peak_rss_mib']:.0f}MiB "
                f"({fits[stem]['groups_not_converged']} missing)" if "error" not in fits[stem] else f"{stem} failed"
                for stem in ("flat", "informed")))
    return "\n".join(rows)


def _not_measured(point: dict) -> str:
    """Why a scaling point has no seconds: skipped on its estimate, or failed."""
    if "skipped" in point:
        return f"skipped (expected {point['estimated_minutes']:g} min)"
    if "seconds_run" in point:
        return f"failed after {point['seconds_run'] / 60:.0f} min"
    return "failed"


def _write(path: Path, result: dict) -> None:
    """Write ``result`` to ``path`` whole (a temporary file, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


SECTIONS = ("backends", "floor", "repro", "scaling", "cluster", "many_groups")
REPORT = ROOT / "reports" / "benchmark.json"  # what `make bench` writes, and a smoke run never does


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help=f"the JSON written (default {REPORT.relative_to(ROOT)}; "
                        "required with --smoke, and another file)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="sections to run (backends floor repro scaling cluster many_groups); default all")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--variants", nargs="*", default=None, choices=list(VARIANTS),
                        help="backends-section rows to run (default all); the others keep their last values")
    parser.add_argument("--scaling-rows", nargs="*", default=None, choices=list(SCALING_ROWS),
                        help="scaling-section rows to run (default all); the others keep their last values")
    parser.add_argument("--nuts-groups", nargs="*", type=int, default=None,
                        help="the hier_nuts scaling row's numbers of groups (default: benchmarks/sizes.py's)")
    parser.add_argument("--fixed-groups", nargs="*", type=int, default=None,
                        help="the hier_nuts_fixed scaling row's numbers of groups (default: benchmarks/sizes.py's)")
    parser.add_argument("--point-limit-min", type=float, default=None,
                        help="minutes a hier_nuts point may run before it is stopped (default: benchmarks/sizes.py's "
                             "30); a point the budget expects past it is not run")
    parser.add_argument("--fixed-limit-min", type=float, default=None,
                        help="the same for a hier_nuts_fixed point (default: benchmarks/sizes.py's 70)")
    parser.add_argument("--smoke", action="store_true",
                        help="every chosen row and section at tiny settings (benchmarks/sizes.py SMOKE), to check "
                             "that they run, not to measure; writes only --out, and only this run's results")
    args = parser.parse_args(argv)
    if args.smoke and (args.out is None or args.out.resolve() == REPORT.resolve()):
        print(f"error: --smoke needs --out naming a file other than {REPORT.relative_to(ROOT)} (a smoke run's "
              "figures measure nothing)", file=sys.stderr)
        return 2
    out_path = args.out or REPORT
    sizes = SMOKE if args.smoke else FULL
    sections = set(args.only or SECTIONS)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="hbnn-bench-"))
    stamp = run_stamp()
    result: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "python": platform.python_version()},
                    "definitions": DEFINITIONS, "smoke": args.smoke}
    # a smoke run's file holds that run alone; a full run's keeps the sections (and rows) it does not run
    previous = json.loads(out_path.read_text()) if out_path.exists() and not args.smoke else {}
    result["measured"] = {**previous.get("measured", {}), **{s: stamp for s in SECTIONS if s in sections}}
    start = time.perf_counter()
    try:
        if "backends" in sections:
            chosen = {k: v for k, v in VARIANTS.items() if args.variants is None or k in args.variants}
            ran = result["backends"] = backends(work / "backends", chosen, sizes, stamp)
            if args.variants is not None:  # the rows not run keep their last values; ratios only within a run
                result["backends"] = with_speedups(_kept_rows(previous.get("backends", {}), ran))
        if "floor" in sections:
            result["numpy_floor_us_per_grad"] = numpy_floor_us_per_grad(sizes.floor_repeats, sizes.floor_number)
        if "repro" in sections:
            result.update(repro(work, sizes.params))
        if "scaling" in sections:
            rows = tuple(args.scaling_rows or SCALING_ROWS)
            if args.nuts_groups:
                sizes = dataclasses.replace(sizes, nuts_groups=tuple(args.nuts_groups))
            if args.point_limit_min is not None:
                sizes = dataclasses.replace(sizes, point_limit_s=60.0 * args.point_limit_min)
            if args.fixed_groups:
                sizes = dataclasses.replace(sizes, fixed_groups=tuple(args.fixed_groups))
            if args.fixed_limit_min is not None:
                sizes = dataclasses.replace(sizes, fixed_limit_s=60.0 * args.fixed_limit_min)
            before = {k: v for k, v in previous.get("scaling", {}).items() if k in SCALING_ROWS}

            def save(fresh: dict) -> None:  # after every point: a stopped run keeps the points it measured
                # a point not measured again (another row, another size) stays, with the stamp of its own run
                result["scaling"] = {k: {**before.get(k, {}), **fresh.get(k, {})} for k in {*before, *fresh}}
                result["scaling"]["linearity"] = {k: _linearity(v) for k, v in result["scaling"].items()
                                                  if k in ("hier_nuts", "hier_advi", "hier_advi_minibatch") and v}
                _write(out_path, {**previous, **result})

            save(scaling(work / "scaling", sizes, rows, stamp, save))
        if "cluster" in sections:
            result["cluster"] = cluster_speedup(work / "cluster", sizes)
        if "many_groups" in sections:
            result["many_groups"] = many_groups(work / "many_groups", sizes.many_groups, base=sizes.params)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["bench_seconds"] = time.perf_counter() - start
    merged = {**previous, **result}  # sections not run keep their last values
    _write(out_path, merged)
    if "backends" in merged and "numpy_floor_us_per_grad" in merged:
        print(_table(merged))
    if "cluster" in result:
        c = result["cluster"]
        print(f"flat stage: serial {c['serial']['seconds']:.1f}s, 2-worker LocalCluster "
              f"{c['local_cluster_2']['seconds']:.1f}s ({c['speedup']:.2f}x), "
              f"identical metrics: {c['identical_metrics']}")
    if "many_groups" in result:
        m = result["many_groups"]
        print(f"pipeline at {m['settings']['n_groups']} groups: {m['seconds']:.0f}s, peak {m['peak_rss_mib']:.0f} MiB, "
              f"report {m['report_html_mib']:.1f} MiB")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
