"""Users' tables: loading, the stratified split, standardisation and every bad-data error."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hbnn.config_read import parse_params
from hbnn.data.spec import DataSpec
from hbnn.data.tables import load_table_tasks, stratified_split
from hbnn.data.tasks import Tasks, make_tasks
from hbnn.files.io import InputError


def table(rng: np.random.Generator, sizes: dict[str, int]) -> pd.DataFrame:
    """Groups of the given sizes, alternating labels, features on raw (unstandardised) scales."""
    parts = []
    for name, n in sizes.items():
        parts.append(pd.DataFrame({
            "shop": name,
            "price": rng.normal(50, 10, size=n),
            "size": rng.normal(-3, 0.5, size=n),
            "bought": np.arange(n) % 2,
        }))
    return pd.concat(parts, ignore_index=True)


def params(path, likelihood="bernoulli", **data):
    raw = {"seed": 7, "data": {"source": "table", "path": str(path), "features": ["price", "size"],
                               "label": "bought", "group": "shop", **data},
           "model": {"likelihood": likelihood}}
    return parse_params(raw)


@pytest.fixture
def csv(tmp_path):
    df = table(np.random.default_rng(0), {"north": 6, "south": 40, "east": 11})
    path = tmp_path / "shops.csv"
    df.to_csv(path, index=False)
    return path, df


def test_csv_becomes_long_layout_with_table_groups(csv):
    path, df = csv
    tasks = Tasks(load_table_tasks(DataSpec.of(params(path))))
    assert tasks.group_names == ["north", "south", "east"]  # order of first appearance
    assert tasks.features == ["price", "size"]
    assert tasks.ds.sizes["obs"] == len(df)
    assert tasks.ds["y"].dtype == np.int64
    np.testing.assert_array_equal(tasks.ds["y"].values, df["bought"].values)
    assert tasks.group_column == "shop" and tasks.likelihood == "bernoulli"


def test_features_standardised_with_training_rows_only(csv):
    path, df = csv
    tasks = Tasks(load_table_tasks(DataSpec.of(params(path))))
    train = tasks.split("train")
    np.testing.assert_allclose(train.X.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(train.X.std(axis=0), 1.0, rtol=1e-12)
    raw_train = df[["price", "size"]].to_numpy()[train.obs]
    np.testing.assert_allclose(tasks.x_mean, raw_train.mean(axis=0))
    np.testing.assert_allclose(tasks.x_sd, raw_train.std(axis=0))
    # stored X is exactly (raw - mean) / sd for every row, test rows included
    np.testing.assert_allclose(tasks.ds["X"].values, (df[["price", "size"]].to_numpy() - tasks.x_mean) / tasks.x_sd)
    off = Tasks(load_table_tasks(DataSpec.of(params(path, standardize=False))))
    np.testing.assert_array_equal(off.ds["X"].values, df[["price", "size"]].to_numpy())
    np.testing.assert_array_equal(off.x_sd, [1.0, 1.0])


def test_split_is_stratified_seeded_and_leaves_train_and_test_rows(csv):
    path, df = csv
    ds = load_table_tasks(DataSpec.of(params(path)))
    split = ds["split"].values
    for name in ("north", "south", "east"):
        rows = df["shop"].to_numpy() == name
        for label in (0, 1):
            cell = rows & (df["bought"].to_numpy() == label)
            k = (split[cell] == "train").sum()
            assert k == min(max(round(cell.sum() * 0.5), 1), cell.sum() - 1)
    assert ds.identical(load_table_tasks(DataSpec.of(params(path))))
    other = load_table_tasks(DataSpec.of(parse_params({**params(path).to_dict(), "seed": 8})))
    assert not np.array_equal(other["split"].values, split)


def test_a_groups_split_depends_on_its_name_and_rows_not_on_other_groups(csv, tmp_path):
    """Dropping a group (what an error about a too-small group asks) or reordering the groups leaves every
    other group's split as it was: each group's stream is keyed by its name, not by its place in the file."""
    path, df = csv
    split = pd.Series(load_table_tasks(DataSpec.of(params(path)))["split"].values, index=df.index)
    other = df[df.shop != "north"].iloc[::-1]  # north dropped, the groups (and their rows) in reverse order
    other = pd.concat([g.iloc[::-1] for _, g in other.groupby("shop", sort=False)])  # each group's rows as before
    path2 = tmp_path / "other.csv"
    other.to_csv(path2, index=False)
    split2 = pd.Series(load_table_tasks(DataSpec.of(params(path2)))["split"].values, index=other.index)
    assert list(other.shop.unique()) == ["east", "south"]
    pd.testing.assert_series_equal(split2.sort_index(), split[df.shop != "north"])


@pytest.mark.parametrize("part", ["train", "test"])
def test_a_value_too_large_is_named_in_training_and_test_rows(tmp_path, part):
    """In a training row 1e308 overflows the column's sd (every scaled value then 0, finite but wrong); in a test
    row the scaled value is too large: both are the same error, naming the column and the value."""
    df = table(np.random.default_rng(1), {"a": 8, "b": 8})
    df["part"] = np.where(np.arange(16) % 4 == 0, "test", "train")
    row = int(np.flatnonzero(df["part"].to_numpy() == part)[1])
    df.loc[row, "price"] = 1e308
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    with pytest.raises(InputError, match=r"feature column 'price' has values too large to use \(e.g. 1e\+308 in row"):
        load_table_tasks(DataSpec.of(params(path, split="part")))


def test_split_of_tiny_groups():
    codes = np.array([0, 0, 1, 2, 2, 2])
    strata = np.array([0, 1, 0, 0, 0, 1])
    split = stratified_split(codes, strata, 0.5, seed=1)
    assert list(split[:2]).count("test") == 1  # two singleton cells: one row moves to test
    assert split[2] == "train"  # a one-row group trains
    assert (split[3:] == "test").sum() >= 1 and (split[3:] == "train").sum() >= 1


def test_split_column_is_used_as_given(tmp_path):
    df = table(np.random.default_rng(1), {"a": 8, "b": 8})
    df["part"] = np.where(np.arange(16) % 4 == 0, "test", "train")
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    ds = load_table_tasks(DataSpec.of(params(path, split="part")))
    np.testing.assert_array_equal(ds["split"].values, df["part"].values)


def test_parquet_reads_like_csv(csv, tmp_path):
    path, df = csv
    pq = tmp_path / "shops.parquet"
    df.to_parquet(pq)
    a, b = load_table_tasks(DataSpec.of(params(path))), load_table_tasks(DataSpec.of(params(pq)))
    np.testing.assert_allclose(a["X"].values, b["X"].values, rtol=1e-12)
    np.testing.assert_array_equal(a["split"].values, b["split"].values)


def test_gaussian_labels_are_standardised_floats(tmp_path):
    df = table(np.random.default_rng(2), {"a": 10, "b": 12})
    df["bought"] = 100 + 20 * np.random.default_rng(3).normal(size=len(df))
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    tasks = Tasks(load_table_tasks(DataSpec.of(params(path, likelihood="gaussian"))))
    train = tasks.split("train")
    assert tasks.ds["y"].dtype == np.float64
    assert train.y.mean() == pytest.approx(0.0, abs=1e-12) and train.y.std() == pytest.approx(1.0)
    np.testing.assert_allclose(tasks.y_mean + tasks.y_sd * tasks.ds["y"].values, df["bought"].values)


def test_constant_column_is_left_unscaled(tmp_path):
    df = table(np.random.default_rng(4), {"a": 10, "b": 10})
    df["one"] = 1.0
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    tasks = Tasks(load_table_tasks(DataSpec.of(params(path, features=["price", "one"]))))
    assert tasks.x_mean[1] == 0.0 and tasks.x_sd[1] == 1.0
    assert (tasks.ds["X"].values[:, 1] == 1.0).all()


def test_make_tasks_dispatches_on_source(csv):
    path, _ = csv
    assert make_tasks(DataSpec.of(params(path))).attrs["source"] == "table"
    assert make_tasks(DataSpec.of(parse_params({"n_groups": 2}))).attrs["source"] == "moons"


def _bad(tmp_path, edit, likelihood="bernoulli", **data):
    df = table(np.random.default_rng(5), {"alpha": 8, "beta": 10}).astype({"price": object})
    df = edit(df)
    path = tmp_path / "bad.csv"
    df.to_csv(path, index=False)
    with pytest.raises(InputError) as err:
        load_table_tasks(DataSpec.of(params(path, likelihood, **data)))
    return str(err.value)


def _set(col, row, value):
    def edit(df):
        df.loc[row, col] = value
        return df
    return edit


@pytest.mark.parametrize(
    "edit, data, expected",
    [
        (lambda df: df, {"features": ["price", "weight"]}, "no column 'weight' (data.features[1])"),
        (lambda df: df, {"label": "sold"}, "no column 'sold' (data.label)"),
        (lambda df: df, {"group": "store"}, "no column 'store' (data.group)"),
        (lambda df: df, {"split": "part"}, "no column 'part' (data.split)"),
        (_set("price", 3, None), {}, "feature column 'price' has 1 missing value (row 4)"),
        (_set("price", 2, "cheap"), {}, "feature column 'price' is not numeric (e.g. 'cheap' in row 3)"),
        (_set("bought", 5, 2), {}, "label column 'bought' must hold 0 or 1"),
        (_set("bought", 5, None), {}, "label column 'bought' has 1 missing value (row 6)"),
        (_set("shop", 0, None), {}, "group column 'shop' has 1 missing value (row 1)"),
        (lambda df: df.assign(bought=np.where(df["shop"] == "beta", 1, df["bought"])), {},
         "group 'beta' has only class 1"),
        (lambda df: df.assign(part=np.where(df.index == 0, "train", "test")), {"split": "part"},
         "group 'alpha' has 1 training rows (of 8)"),
        (lambda df: df.assign(part="validation"), {"split": "part"},
         "split column 'part' must hold 'train' or 'test'"),
    ],
)
def test_bad_data_stops_with_a_named_error(tmp_path, edit, data, expected):
    assert expected in _bad(tmp_path, edit, **data)


def test_a_label_that_is_text_or_not_finite_is_named_for_what_it_is(tmp_path):
    assert "label column 'bought' is not numeric (e.g. 'yes' in row 6)" in _bad(
        tmp_path, lambda df: df.astype({"bought": object}).pipe(_set("bought", 5, "yes")), "gaussian")
    for value in (np.inf, "1e310"):  # a number, only not finite (the second overflows when read)
        message = _bad(tmp_path, lambda df, v=value: df.astype({"bought": object}).pipe(_set("bought", 5, v)),
                       "gaussian")
        assert "label column 'bought' has a non-finite value in row 6" in message
        assert "not numeric" not in message and "np.float64" not in message


def test_small_group_is_a_named_error(tmp_path):
    def edit(df):
        return pd.concat([df, df.iloc[:2].assign(shop="gamma")], ignore_index=True)
    # 2 rows with different labels: one trains, one tests -> 1 training row
    assert "group 'gamma' has 1 training rows (of 2)" in _bad(tmp_path, edit)


def test_missing_table_and_wrong_format(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_table_tasks(DataSpec.of(params(tmp_path / "nope.csv")))
    bad = tmp_path / "x.parquet"
    bad.write_text("not parquet")
    with pytest.raises(InputError, match="not a readable .parquet file"):
        load_table_tasks(DataSpec.of(params(bad)))
