"""Where the per-group fits run: in the stage's process, or in shards on a Dask cluster.

The flat, informed and transfer stages fit one small model per group, and the fits are independent.
``HBNN_DASK_SCHEDULER`` says where they run:

- unset or empty: in the stage's own process, one group after another;
- ``local`` or ``local:N``: a ``dask.distributed.LocalCluster`` of N worker processes (default: every core), one
  thread each, started for the fit and closed after it;
- the address of a running scheduler, ``tcp://host:port`` (or ``tls://``, ``ws://``, ``wss://``; a bare
  ``host:port`` is TCP), whose workers need this project's pinned environment and ``hbnn`` importable.

Any other value (``ucx://``, whose transport is not installed; ``inproc://``, a scheduler inside this process; a
missing or non-numeric port) is refused by :func:`check_scheduler` with :class:`~hbnn.errors.InputError` before
any group is fitted.

``HBNN_DASK_SHARDS`` sets the number of shards (default: 4 per worker, and more where that leaves over 10 groups in
a shard, at most one per group). Groups are split into contiguous shards; the model and its settings are sent to
every worker once, and a worker compiles the model once per fit and keeps it for its next shard of the same fit.

Where a group runs does not change its draws. Its seed comes from its position in the stage's list of groups
(:func:`hbnn.pipeline.variants.derive_seed`), and every worker compiles the model from the same rows (the first
group's). So the same params give the same draws per group in-process, on a LocalCluster and on a cluster of the
same CPU type and pins. That is why the scheduler is an environment variable, not a DVC param: changing it reruns
nothing.

A worker that dies mid-shard (killed, out of memory) has its shard rerun on another worker by the scheduler, up to
``distributed.scheduler.allowed-failures`` times (Dask's default: 3). If the dead worker took the scattered model
with it, the scheduler cancels the shards that need it instead (scattered data cannot be recomputed); those are
resubmitted with the model scattered again, up to :data:`SHARD_RESUBMITS` times. A shard that still fails fails the
stage, which then writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import xarray as xr

from hbnn.config import SamplerParams
from hbnn.errors import InputError, SamplingError, one_line

log = logging.getLogger(__name__)

SCHEDULER_ENV = "HBNN_DASK_SCHEDULER"
# local:N starts N worker processes here, each holding a Python, NumPy and a compiled model: more than this many per
# core only queue for the cores and fill the memory (a worker's size: benchmarks/FINDINGS.md, section 'Measurements
# behind code comments')
MAX_WORKERS_PER_CORE = 4
SHARDS_ENV = "HBNN_DASK_SHARDS"
SHARDS_PER_WORKER = 4
GROUPS_PER_SHARD = 10
SHARD_RESUBMITS = 3  # a shard the scheduler cancelled (its scattered model lost with a worker) is sent again
SCHEMES = ("tcp", "tls", "ws", "wss")  # Dask's transports that this environment has (ucx needs distributed-ucxx)
# host:port of an address: a name or IPv4 address, or an IPv6 address in brackets, and the port's digits
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


@dataclass(frozen=True)
class Model:
    """What a worker needs to compile a fit's model.

    Parameters
    ----------
    build : callable
        ``build(x, y)`` returns the PyMC model.
    settings : hbnn.config.SamplerParams
        The sampler's settings.
    x, y : numpy.ndarray
        The rows the model is built from (the stage's first group), the same in every process, so the compiled
        model is the same everywhere.
    density : hbnn.density.densities.Density, optional
        The model's hand-written log density, on any group's rows (:mod:`hbnn.density.kernel`).
    """

    build: Callable
    settings: SamplerParams
    x: np.ndarray
    y: np.ndarray
    density: object | None = None  # the model's hand-written log density (hbnn.density.kernel), on any group's rows


@dataclass(frozen=True)
class GroupJob:
    """One group's fit.

    Parameters
    ----------
    index, name, seed
        Its position in the stage's groups, the group's name and the fit's seed.
    x, y : numpy.ndarray
        The group's training rows and labels.
    """

    index: int
    name: str
    seed: int
    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class GroupResult:
    """One group's fit, done.

    Parameters
    ----------
    index, name
        As the :class:`GroupJob`'s.
    posterior, sample_stats : xarray.Dataset
        The draws and the sampler's statistics of them.
    seconds, grad_evals, divergences
        Sampling seconds, gradient evaluations (``None`` where the backend does not report them) and divergent
        transitions after tuning.
    """

    index: int
    name: str
    posterior: xr.Dataset
    sample_stats: xr.Dataset
    seconds: float
    grad_evals: int | None
    divergences: int


@dataclass(frozen=True)
class Fitted:
    """Every group's result in the stage's group order, and the seconds spent compiling.

    Parameters
    ----------
    results : list of GroupResult
        In the stage's group order.
    compile_seconds : float or None
        Summed over the processes that compiled (``None`` where the backend compiles inside every sampling call).
    where : str
        Where the fits ran, for the log.
    """

    results: list[GroupResult]
    compile_seconds: float | None
    where: str


# The model compiled last in this process, by fit key: a worker keeps it for its next shard of the same fit.
_COMPILED: dict[str, object] = {}


def fit_shard(key: str, model: Model, jobs: Sequence[GroupJob],
              on_done: Callable[[GroupResult], None] | None = None) -> tuple[list[GroupResult], float | None]:
    """Fit jobs in order, with the model compiled once per process and fit.

    With nutpie each fit runs beside the next (:meth:`hbnn.sampling.sampler.Sampler.sample_each`).

    Parameters
    ----------
    key : str
        The fit's key: a process keeps the model it compiled for it, for its next shard.
    model, jobs
        What to compile (:class:`Model`) and the groups to fit (:class:`GroupJob`).
    on_done : callable, optional
        Called with each :class:`GroupResult` as it is done.

    Returns
    -------
    tuple of (list of GroupResult, float or None)
        The results, and the seconds this call spent compiling (0 when the process had already compiled this fit;
        ``None`` for backends that compile while sampling).
    """
    from hbnn.sampling.sampler import Sampler

    compile_seconds = 0.0
    sampler = _COMPILED.get(key)
    if sampler is None:
        _COMPILED.clear()
        density = None if model.density is None else model.density.with_rows(model.x, model.y)
        sampler = _COMPILED[key] = Sampler(lambda: model.build(model.x, model.y), model.settings, density)
        compile_seconds = sampler.compile_seconds
    elif sampler.compile_seconds is None:
        compile_seconds = None
    with contextlib.closing(sampler.sample_each([(job.seed, {"x": job.x, "y": job.y}) for job in jobs])) as fits:
        results = [_result(job, fit, on_done) for job, fit in zip(jobs, fits, strict=True)]
    return results, compile_seconds


def _result(job: GroupJob, fit, on_done: Callable[[GroupResult], None] | None) -> GroupResult:
    stats = fit.posterior.sample_stats
    result = GroupResult(
        index=job.index,
        name=job.name,
        posterior=fit.posterior.posterior,
        sample_stats=stats,
        seconds=fit.seconds,
        grad_evals=fit.grad_evals,
        divergences=int(stats["diverging"].sum()) if "diverging" in stats else 0,
    )
    if on_done is not None:
        on_done(result)
    return result


def forget(key: str) -> None:
    """Drop the model compiled for fit ``key`` (:func:`fit_shard`) in this process, if it is the one kept.

    Parameters
    ----------
    key : str
    """
    _COMPILED.pop(key, None)


def fit_groups(what: str, model: Model, jobs: Sequence[GroupJob],
               on_done: Callable[[GroupResult], None] | None = None) -> Fitted:
    """Fit every job where :data:`SCHEDULER_ENV` says (see the module doc).

    Parameters
    ----------
    what : str
        The stage's name, for the log and the fit's key.
    model, jobs, on_done
        As for :func:`fit_shard`.

    Returns
    -------
    Fitted
        Results in ``jobs`` order.

    Raises
    ------
    hbnn.errors.InputError
        Where :data:`SCHEDULER_ENV` or :data:`SHARDS_ENV` is malformed, the scheduler cannot be reached, or it has
        no workers.
    hbnn.errors.SamplingError
        Where a shard fails on the cluster, or is cancelled more than :data:`SHARD_RESUBMITS` times.
    """
    scheduler = scheduler_setting()
    key = f"{what}-{uuid.uuid4().hex}"
    try:
        if not scheduler:
            results, compile_seconds = fit_shard(key, model, jobs, on_done)
            return Fitted(results, compile_seconds, "in this process")
        with connect(scheduler) as client:
            return _fit_on(client, what, key, model, jobs, on_done)
    finally:
        forget(key)


def _fit_on(client, what: str, key: str, model: Model, jobs: Sequence[GroupJob],
            on_done: Callable[[GroupResult], None] | None) -> Fitted:
    from concurrent.futures import CancelledError

    from dask.distributed import as_completed

    workers = len(client.scheduler_info(n_workers=-1)["workers"])
    if workers == 0:
        raise InputError(f"{SCHEDULER_ENV}: the scheduler at {client.scheduler.address} has no workers")
    shards = split(jobs, shard_count(len(jobs), workers))
    where = f"{len(shards)} shards on {workers} Dask workers at {client.scheduler.address}"
    log.info("%s: %d groups in %s", what, len(jobs), where)
    # The scattered model: sent once, not with every shard; again only if a worker took the last copy along.
    shared = [client.scatter(model, broadcast=True, hash=False)]
    futures: dict = {}  # shard future -> (shard, index in shared of the model it uses)

    def submit(i: int, name: str):
        future = client.submit(fit_shard, key, shared[-1], shards[i], pure=False, key=name)
        futures[future] = (i, len(shared) - 1)
        return future

    running = as_completed([submit(i, f"{key}-shard-{i}") for i in range(len(shards))])
    resubmitted = [0] * len(shards)
    results: list[GroupResult] = []
    compile_seconds: float | None = 0.0
    try:
        for future in running:
            i, used = futures[future]
            try:
                done, seconds = future.result()
            except CancelledError as err:
                # The scheduler forgot the shard: its scattered model was lost with a killed worker (scattered
                # data cannot be recomputed), so its retries never ran. Scatter the model again (once for all
                # the shards that lost the same copy) and resubmit.
                if resubmitted[i] >= SHARD_RESUBMITS:
                    raise SamplingError(f"{what}: shard {i} was cancelled on the Dask cluster "
                                        f"{resubmitted[i] + 1} times: {one_line(err)}") from err
                resubmitted[i] += 1
                log.warning("%s: shard %d was cancelled (%s); resubmitting it", what, i, one_line(err))
                if used == len(shared) - 1:
                    shared.append(client.scatter(model, broadcast=True, hash=False))
                running.add(submit(i, f"{key}-shard-{i}-again-{resubmitted[i]}"))
                continue
            except Exception as err:  # noqa: BLE001 - a worker's error or a shard lost past its retries
                raise SamplingError(f"{what}: a shard failed on the Dask cluster: {type(err).__name__}: "
                                    f"{one_line(err)}") from err
            compile_seconds = None if seconds is None or compile_seconds is None else compile_seconds + seconds
            for result in done:
                results.append(result)
                if on_done is not None:
                    on_done(result)
    finally:
        client.cancel([*futures, *shared])
        with contextlib.suppress(Exception):  # cleanup only: never hide the fit's own error
            client.run(forget, key)  # the workers of a long-lived cluster drop this fit's compiled model
    results.sort(key=lambda r: r.index)
    return Fitted(results, compile_seconds, where)


def shard_count(n_jobs: int, workers: int) -> int:
    """How many shards the jobs are split into.

    Parameters
    ----------
    n_jobs, workers : int
        The number of groups and of the cluster's workers.

    Returns
    -------
    int
        :data:`SHARDS_ENV` if set, else :data:`SHARDS_PER_WORKER` per worker and at most :data:`GROUPS_PER_SHARD`
        groups per shard (the progress line moves as shards finish); at most one per job, at least one.

    Raises
    ------
    hbnn.errors.InputError
        Where :data:`SHARDS_ENV` is not a whole number of at least 1.
    """
    raw = os.environ.get(SHARDS_ENV, "").strip()
    if raw:
        try:
            wanted = int(raw)
        except ValueError:
            wanted = 0
        if wanted < 1:
            raise InputError(f"{SHARDS_ENV}={raw!r}: expected a whole number of shards, at least 1")
    else:
        wanted = max(SHARDS_PER_WORKER * workers, -(-n_jobs // GROUPS_PER_SHARD))
    return max(1, min(wanted, n_jobs))


def split(jobs: Sequence[GroupJob], n: int) -> list[list[GroupJob]]:
    """``jobs`` in ``n`` contiguous shards whose sizes differ by at most one (none empty).

    Parameters
    ----------
    jobs : sequence of GroupJob
    n : int

    Returns
    -------
    list of list of GroupJob
    """
    size, extra = divmod(len(jobs), n)
    shards, start = [], 0
    for i in range(n):
        stop = start + size + (i < extra)
        shards.append(list(jobs[start:stop]))
        start = stop
    return [s for s in shards if s]


def scheduler_setting() -> str:
    """:data:`SCHEDULER_ENV`, stripped (``""`` where unset); :class:`~hbnn.errors.InputError` as
    :func:`check_scheduler` raises it.

    Returns
    -------
    str
    """
    scheduler = os.environ.get(SCHEDULER_ENV, "").strip()
    check_scheduler(scheduler)
    return scheduler


def check_scheduler(scheduler: str) -> None:
    """Refuse a scheduler setting that is not one of the forms the module doc lists.

    Parameters
    ----------
    scheduler : str
        Empty, ``local``, ``local:N`` or a scheduler address over a transport of :data:`SCHEMES`.

    Raises
    ------
    hbnn.errors.InputError
        Naming :data:`SCHEDULER_ENV` and its value, for any other form.
    """
    if not scheduler or local_workers(scheduler) is not None:
        return
    expected = (f"expected local, local:N with N >= 1 workers, or a scheduler address {'|'.join(SCHEMES)}://host:port "
                "such as tcp://host:8786")
    scheme, _, address = scheduler.rpartition("://")
    scheme = scheme.lower() or "tcp"  # Dask's default transport
    if scheme not in SCHEMES:
        why = {"ucx": "needs UCX's transport (distributed-ucxx), which is not installed",
               "inproc": "is a scheduler inside one process, which worker processes cannot reach"}.get(
                   scheme, "is not a Dask transport")
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: {scheme}:// {why}; {expected}")
    match = _HOST_PORT.fullmatch(address)
    if match is None:
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: {address!r} is not host:port; {expected}")
    if not 1 <= int(match["port"]) <= 65535:
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: port {match['port']} is not in 1-65535; {expected}")


def local_workers(scheduler: str) -> int | None:
    """The worker count of a local cluster.

    Parameters
    ----------
    scheduler : str
        The setting of :data:`SCHEDULER_ENV`.

    Returns
    -------
    int or None
        N for ``local:N``, every core for ``local``, ``None`` for an address.

    Raises
    ------
    hbnn.errors.InputError
        Where N is not a whole number of at least 1, or more than :data:`MAX_WORKERS_PER_CORE` per core.
    """
    if scheduler == "local":
        return os.cpu_count() or 1
    if not scheduler.startswith("local:"):
        return None
    raw = scheduler.partition(":")[2]
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: expected local, local:N with N >= 1 workers, or a "
                         "scheduler address such as tcp://host:8786")
    cores = os.cpu_count() or 1
    if int(raw) > MAX_WORKERS_PER_CORE * cores:
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: {int(raw)} worker processes on this machine's {cores} "
                         f"cores (at most {MAX_WORKERS_PER_CORE * cores}: each worker is a process of its own, with "
                         "its own memory); use local, or a scheduler address for a larger cluster")
    return int(raw)


@contextmanager
def connect(scheduler: str, timeout: float = 20.0) -> Iterator[object]:
    """A Dask client for a scheduler, closed after use.

    Dask's own log lines are kept at WARNING, in the workers too, and a LocalCluster's
    workers may start processes of their own (PyMC's chains).

    Parameters
    ----------
    scheduler : str
        ``local``, ``local:N`` (a LocalCluster started here) or a scheduler's address.
    timeout : float, default 20.0
        Seconds to wait for the scheduler.

    Yields
    ------
    dask.distributed.Client

    Raises
    ------
    hbnn.errors.InputError
        Where the setting is malformed or the scheduler cannot be reached.
    """
    check_scheduler(scheduler)
    n_local = local_workers(scheduler)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # read by the workers' processes
    import dask
    from dask.distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    cluster = None
    start = time.perf_counter()
    try:
        if n_local is not None:
            with dask.config.set({"distributed.worker.daemon": False}):
                # the scheduler's HTTP endpoint on a free local port: the default 8787 is taken by the
                # LocalCluster of any other stage running beside this one (a queue of experiments)
                cluster = LocalCluster(n_workers=n_local, threads_per_worker=1, processes=True,
                                       dashboard_address="127.0.0.1:0")
            client = Client(cluster, timeout=timeout)
        else:
            client = Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as err:
        if cluster is not None:
            cluster.close()
        raise InputError(f"{SCHEDULER_ENV}={scheduler!r}: cannot reach the Dask scheduler ({one_line(err)})") \
            from err
    log.debug("Dask client for %s ready in %.1fs", scheduler, time.perf_counter() - start)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

