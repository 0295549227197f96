"""Shared fixtures: tiny parameter sets and task data."""

from __future__ import annotations

import numpy as np
import pytest

from hbnn.config import parse_params
from hbnn.data import Tasks, make_moons_tasks, tasks_dataset

TINY = {
    "n_groups": 3,
    "seed": 31,
    "data": {"n_samples": 40},
    "sampler": {"tune": 40, "draws": 25, "chains": 2},
    "hier_sampler": {"backend": "nutpie", "tune": 40, "draws": 25, "chains": 2},
    "prior": {"draws_per_sample": 2},
    "report": {"grid_size": 12, "surface_draws": 20},
}


@pytest.fixture
def tiny_params():
    return parse_params(TINY)


@pytest.fixture
def tiny_tasks(tiny_params):
    return Tasks(make_moons_tasks(tiny_params))


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
