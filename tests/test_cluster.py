"""Per-group fits on a Dask LocalCluster: the same draws as in-process, retried shards, clear errors."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import arviz as az
import cloudpickle
import numpy as np
import pytest
from conftest import TINY

from hbnn.config_read import parse_params
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.errors import InputError, SamplingError
from hbnn.files.outputs import write_netcdf
from hbnn.fitting.common import model_spec
from hbnn.fitting.per_group import fit_per_group
from hbnn.model.builders import build_flat_model
from hbnn.pipeline.stages import fit_flat as stage
from hbnn.sampling import cluster

# The builders below run in the workers' processes, which cannot import this test module: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PARAMS = parse_params({"model": {"hidden_layers": [2]},
                       "sampler": {"tune": 30, "draws": 20, "chains": 2, "max_draws": 0}})


def _fit_flat(params, tasks, build, density=None):
    """fit_flat's per-group loop with the run's sampler and model, as the stage calls it."""
    return fit_per_group("fit_flat", params.sampler, model_spec(params, tasks), tasks, build, density)


def _builder(tasks):
    def build(X, y):
        return build_flat_model(X, y, tasks.features, (2,))

    return build


def _killing_builder(tasks, marker: Path):
    """Kills the first worker process that compiles it (SIGKILL, as the OOM killer would); builds after that."""

    def build(X, y):
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return build_flat_model(X, y, tasks.features, (2,))

    return build


def _failing_builder(X, y):
    raise ValueError("no model here")


@pytest.fixture
def serial(ragged_tasks, monkeypatch):
    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    return _fit_flat(PARAMS, ragged_tasks, _builder(ragged_tasks))


def test_a_local_cluster_gives_the_same_draws_per_group(ragged_tasks, serial, monkeypatch):
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:2")
    monkeypatch.setenv(cluster.SHARDS_ENV, "2")  # groups a | b, c: one worker samples two groups with one compile
    on_cluster = _fit_flat(PARAMS, ragged_tasks, _builder(ragged_tasks))
    assert on_cluster.posterior.identical(serial.posterior)
    assert on_cluster.sample_stats["diverging"].identical(serial.sample_stats["diverging"])
    assert on_cluster.cost.grad_evals == serial.cost.grad_evals
    assert list(on_cluster.posterior["group"].values) == ["a", "b", "c"]


def test_a_killed_workers_shard_is_retried_and_the_fit_is_complete(ragged_tasks, serial, monkeypatch, tmp_path):
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:2")
    marker = tmp_path / "killed"
    fitted = _fit_flat(PARAMS, ragged_tasks, _killing_builder(ragged_tasks, marker))
    assert marker.exists() and int(marker.read_text()) != os.getpid()  # a worker died, not this process
    assert fitted.posterior.identical(serial.posterior)


def test_shards_cancelled_with_their_scattered_model_are_resubmitted(ragged_tasks, serial, monkeypatch, caplog):
    """A worker killed while it holds the only copy of the scattered model makes the scheduler forget the shards
    that need it (scattered data cannot be recomputed): here the first scattered model is cancelled outright.
    The shards come back cancelled, are resubmitted with the model scattered again, and the draws are the same."""
    from distributed import Client

    real = Client.scatter
    scattered = []

    def scatter_then_lose_the_first(self, *args, **kwargs):
        future = real(self, *args, **kwargs)
        scattered.append(future)
        if len(scattered) == 1:
            self.cancel(future)
        return future

    monkeypatch.setattr(Client, "scatter", scatter_then_lose_the_first)
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:2")
    monkeypatch.setenv(cluster.SHARDS_ENV, "2")
    with caplog.at_level("WARNING", logger="hbnn.sampling.cluster"):
        fitted = _fit_flat(PARAMS, ragged_tasks, _builder(ragged_tasks))
    assert len(scattered) >= 2 and "resubmitting it" in caplog.text
    assert fitted.posterior.identical(serial.posterior)


def test_a_shard_cancelled_every_time_fails_the_fit_in_one_line(ragged_tasks, monkeypatch):
    from distributed import Client

    real = Client.scatter

    def scatter_and_lose(self, *args, **kwargs):
        future = real(self, *args, **kwargs)
        self.cancel(future)
        return future

    monkeypatch.setattr(Client, "scatter", scatter_and_lose)
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:1")
    monkeypatch.setenv(cluster.SHARDS_ENV, "1")
    with pytest.raises(SamplingError, match=r"fit_flat: shard 0 was cancelled on the Dask cluster 4 times") as err:
        _fit_flat(PARAMS, ragged_tasks, _builder(ragged_tasks))
    assert "\n" not in str(err.value)


def test_a_shard_that_fails_everywhere_fails_the_fit_in_one_line(ragged_tasks, monkeypatch):
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:1")
    expected = r"fit_flat: a shard failed on the Dask cluster: ValueError: no model"
    with pytest.raises(SamplingError, match=expected) as err:
        _fit_flat(PARAMS, ragged_tasks, _failing_builder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["local:0", "local:x", "local:-1"])
def test_a_bad_local_worker_count_is_named(value):
    with pytest.raises(InputError, match=r"HBNN_DASK_SCHEDULER='local:"):
        cluster.local_workers(value)


def test_an_unreachable_scheduler_is_one_clear_error(ragged_tasks, monkeypatch):
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "tcp://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(InputError, match=r"cannot reach the Dask scheduler"):
        with cluster.connect("tcp://127.0.0.1:9", timeout=2):
            pass


@pytest.mark.parametrize(("n_jobs", "n", "sizes"), [(7, 3, [3, 2, 2]), (2, 2, [1, 1]), (5, 1, [5])])
def test_shards_are_contiguous_and_even(n_jobs, n, sizes):
    jobs = [cluster.GroupJob(i, f"g{i}", i, np.zeros((1, 2)), np.zeros(1)) for i in range(n_jobs)]
    shards = cluster.split(jobs, n)
    assert [len(s) for s in shards] == sizes
    assert [j.index for s in shards for j in s] == list(range(n_jobs))


def test_shard_count_defaults_to_four_per_worker_and_ten_groups_a_shard_and_reads_the_env(monkeypatch):
    monkeypatch.delenv(cluster.SHARDS_ENV, raising=False)
    assert cluster.shard_count(60, 2) == 8
    assert cluster.shard_count(100, 2) == 10  # at most 10 groups a shard
    assert cluster.shard_count(1001, 2) == 101
    assert cluster.shard_count(3, 2) == 3
    monkeypatch.setenv(cluster.SHARDS_ENV, "5")
    assert cluster.shard_count(100, 2) == 5
    monkeypatch.setenv(cluster.SHARDS_ENV, "zero")
    with pytest.raises(InputError, match="HBNN_DASK_SHARDS='zero'"):
        cluster.shard_count(100, 2)


def test_a_stage_whose_worker_is_killed_writes_complete_outputs_identical_to_the_serial_run(tmp_path, monkeypatch):
    """fit_flat end to end on a 2-worker LocalCluster while a worker is SIGKILLed mid-fit: its shard is rerun
    elsewhere, and the stage writes the trace and metrics of the in-process run, byte for byte."""
    params = parse_params(TINY)
    tasks_path = tmp_path / "tasks.nc"
    write_netcdf(make_moons_tasks(DataSpec.of(params)), tasks_path)

    def outputs(name):
        d = tmp_path / name
        return d / "flat.nc", d / "metrics" / "flat.json", d / "timing.json"

    monkeypatch.delenv(cluster.SCHEDULER_ENV, raising=False)
    stage.fit_flat(params, tasks_path, *outputs("serial"))
    marker = tmp_path / "killed"
    from hbnn.fitting import models

    real = models.flat_model

    def killing_model(*args):
        build, density = real(*args)

        def killing(X, y):  # runs in the workers: the closure and this function travel by value
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            return build(X, y)

        return killing, density

    monkeypatch.setattr(models, "flat_model", killing_model)
    # no record of earlier checks: each worker builds PyMC's model to check the density against it, and dies there
    monkeypatch.setenv("HBNN_DENSITY_CHECKS", str(tmp_path / "checks"))
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "local:2")
    stage.fit_flat(params, tasks_path, *outputs("cluster"))
    assert marker.exists() and int(marker.read_text()) != os.getpid()
    metrics = [outputs(name)[1] for name in ("serial", "cluster")]
    assert metrics[0].read_bytes() == metrics[1].read_bytes()
    detail = [m.parent / "detail" / m.name for m in metrics]
    assert detail[0].read_bytes() == detail[1].read_bytes()
    a, b = (az.from_netcdf(o[0]).posterior for o in (outputs("serial"), outputs("cluster")))
    for var in a.data_vars:
        np.testing.assert_array_equal(a[var].values, b[var].values)
