import warnings

import numpy as np
import pytest
from sklearn.datasets import make_moons
from sklearn.preprocessing import scale

from hbnn.config import Params
from hbnn.config_read import parse_params
from hbnn.data.layout import tasks_dataset
from hbnn.data.moons import group_names, make_moons_tasks, standardise_columns, two_moons
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks


def original_notebook_data(seed=31, n_grps=18, n_samples=100):
    """The seed notebook's construction: global legacy seed, np.matrix rotation."""
    np.random.seed(seed)  # noqa: NPY002 - the original's global legacy stream
    Xs, Ys = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix
        for _ in range(n_grps):
            X, Y = make_moons(noise=0.3, n_samples=n_samples)
            X = scale(X)
            rotate_by = np.random.randn() * 90.0  # noqa: NPY002
            theta = np.radians(rotate_by)
            c, s = np.cos(theta), np.sin(theta)
            X = np.asarray(X.dot(np.matrix([[c, -s], [s, c]])))
            Xs.append(X)
            Ys.append(Y)
    Xs, Ys = np.stack(Xs), np.stack(Ys)
    half = n_samples // 2
    return Xs[:, :half], Xs[:, half:], Ys[:, :half], Ys[:, half:]


@pytest.mark.parametrize("n, noise, seed", [(100, 0.3, 31), (7, 0.0, 1), (2, 1.5, 5), (1, 0.1, 2), (250, 0.05, 9)])
def test_two_moons_and_their_scaling_are_scikit_learns_bit_for_bit(n, noise, seed):
    """make_data no longer imports scikit-learn (~2 s); the data must not notice."""
    ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
    for _ in range(3):  # one stream, several groups in a row
        x, y = two_moons(n, noise, ours)
        x_ref, y_ref = make_moons(n_samples=n, noise=noise, random_state=theirs)
        assert np.array_equal(x, x_ref) and np.array_equal(y, y_ref) and y.dtype == y_ref.dtype
        assert np.array_equal(standardise_columns(x), scale(x_ref))
        assert ours.randn() == theirs.randn()  # the streams stay in step
    constant = np.column_stack([np.full(5, 3.0), np.arange(5.0)])
    assert np.array_equal(standardise_columns(constant), scale(constant))


def test_default_data_is_bit_identical_to_original():
    Xtr, Xte, Ytr, Yte = original_notebook_data()
    tasks = Tasks(make_moons_tasks(DataSpec.of(Params())))
    train, test = tasks.split("train"), tasks.split("test")
    assert np.array_equal(train.X, Xtr.reshape(-1, 2))
    assert np.array_equal(test.X, Xte.reshape(-1, 2))
    assert np.array_equal(train.y, Ytr.reshape(-1))
    assert np.array_equal(test.y, Yte.reshape(-1))
    assert tasks.group_names == [f"g{i:02d}" for i in range(18)]
    assert np.array_equal(train.group, np.repeat(np.arange(18), 50))


def test_layout_and_params_flow_through():
    p = parse_params({"n_groups": 4, "seed": 5, "data": {"n_samples": 30, "train_fraction": 0.6, "noise": 0.1}})
    ds = make_moons_tasks(DataSpec.of(p))
    assert ds.sizes == {"obs": 120, "feature": 2, "task": 4}
    assert set(ds["split"].values) == {"train", "test"}
    assert (ds["split"].values == "train").sum() == 4 * 18
    # only the seed differs: different data
    other = make_moons_tasks(DataSpec.of(
        parse_params({"n_groups": 4, "seed": 6, "data": {"n_samples": 30, "train_fraction": 0.6, "noise": 0.1}})
    ))
    assert not np.allclose(ds["X"].values, other["X"].values)


def test_same_params_same_data():
    p = parse_params({"n_groups": 3})
    assert make_moons_tasks(DataSpec.of(p)).identical(make_moons_tasks(DataSpec.of(p)))


def test_group_names_sort_in_order():
    names = group_names(120)
    assert names[:2] == ["g000", "g001"] and names == sorted(names)
    assert group_names(1) == ["g00"]


def test_padded_layout_keeps_real_rows_only_in_valid(ragged_tasks):
    pad = ragged_tasks.padded("train")
    assert pad.X.shape == (3, 12, 2)
    assert list(pad.counts) == [7, 3, 12]
    assert pad.is_ragged
    flat = pad.X.reshape(-1, 2)
    train = ragged_tasks.split("train")
    assert np.array_equal(flat[pad.valid], train.X)
    assert np.array_equal(pad.y, train.y)
    # padding rows are exactly the ones not listed in valid
    assert np.all(np.delete(flat, pad.valid, axis=0) == 0)


@pytest.mark.parametrize("n_groups", [1, 7])
def test_any_number_of_groups(n_groups):
    tasks = Tasks(make_moons_tasks(DataSpec.of(parse_params({"n_groups": n_groups}))))
    assert tasks.n_groups == n_groups
    assert not tasks.padded("train").is_ragged


def test_split_groups_interleaved_rows_and_keeps_row_ids():
    # rows of groups a/b alternate in storage; split() must gather them group by group
    ds = tasks_dataset(
        X=np.arange(12.0).reshape(6, 2), y=[0, 1, 1, 0, 0, 1], group=["b", "a", "b", "a", "b", "a"],
        split=["train"] * 6, features=["x1", "x2"],
    )
    tasks = Tasks(ds)
    assert tasks.group_names == ["b", "a"]  # order of first appearance
    s = tasks.split("train")
    assert list(s.obs) == [0, 2, 4, 1, 3, 5]
    assert list(s.group) == [0, 0, 0, 1, 1, 1]
    np.testing.assert_array_equal(s.X, ds["X"].values[s.obs])
    np.testing.assert_array_equal(s.y, ds["y"].values[s.obs])
    pad = tasks.padded("train")
    np.testing.assert_array_equal(pad.X.reshape(-1, 2)[pad.valid], s.X)
