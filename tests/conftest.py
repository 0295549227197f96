"""Shared fixtures: tiny parameter sets and task data."""

from __future__ import annotations

import numpy as np
import pytest

from hbnn.config_read import parse_params
from hbnn.data.layout import tasks_dataset
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks

TINY = {
    "n_groups": 3,
    "seed": 31,
    "data": {"n_samples": 40},
    # A partial section keeps that section's defaults (hier_sampler's: target 0.98, diag_stan, run-length
    # control), so tiny fits state what they change: no refits or looks past their 25 draws.
    "sampler": {"tune": 40, "draws": 25, "chains": 2, "max_draws": 0},
    "hier_sampler": {"backend": "nutpie", "tune": 40, "draws": 25, "chains": 2, "target_accept": 0.9,
                     "mass_matrix": "diag", "max_draws": 0, "restarts": 0},
    "prior": {"draws_per_sample": 2},
    # the transfer's hierarchical fits' tuning (hier_sampler's is its own); one refit size besides every row
    "transfer": {"tune": 40, "refit_sizes": [2]},
    "report": {"grid_size": 12, "surface_draws": 20},
}


@pytest.fixture(autouse=True, scope="session")
def own_density_checks(tmp_path_factory):
    """Every session checks each hand-written density it samples against PyMC's model (hbnn.density.kernel), in this
    process and in the stage processes it starts, instead of trusting a record left by an earlier run."""
    import os

    before = os.environ.get("HBNN_DENSITY_CHECKS")
    os.environ["HBNN_DENSITY_CHECKS"] = str(tmp_path_factory.mktemp("density_checks"))
    yield
    if before is None:
        os.environ.pop("HBNN_DENSITY_CHECKS", None)
    else:
        os.environ["HBNN_DENSITY_CHECKS"] = before


@pytest.fixture
def tiny_params():
    return parse_params(TINY)


@pytest.fixture
def tiny_tasks(tiny_params):
    return Tasks(make_moons_tasks(DataSpec.of(tiny_params)))


@pytest.fixture
def ragged_tasks():
    """Three groups with 7, 3 and 12 training rows and 2 test rows each."""
    rng = np.random.default_rng(0)
    sizes = {"a": 7, "b": 3, "c": 12}
    X, y, group, split = [], [], [], []
    for name, n in sizes.items():
        X.append(rng.normal(size=(n + 2, 2)))
        y.append(np.arange(n + 2) % 2)
        group += [name] * (n + 2)
        split += ["train"] * n + ["test"] * 2
    return Tasks(tasks_dataset(np.concatenate(X), np.concatenate(y), group, split, ["x1", "x2"]))
