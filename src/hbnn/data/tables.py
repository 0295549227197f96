"""A user's table (CSV or Parquet) as tasks: every column, value, name and group checked, each problem one
:class:`~hbnn.errors.InputError` naming the column, row or group; a seeded split where the table has none;
features and labels standardised with the training rows' statistics.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from hbnn.data.layout import MIN_TRAIN_ROWS, SPLITS, group_slices, tasks_dataset
from hbnn.data.spec import DataSpec
from hbnn.errors import counted, plural, rows_phrase, rows_text
from hbnn.files.io import InputError
from hbnn.model import likelihoods
from hbnn.names import name_problem

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- tables
def read_table(path: str | Path, what: str = "table", text_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A CSV or Parquet file as a DataFrame.

    ``text_columns`` of a CSV (group ids) are read exactly as written: ``01`` and ``1`` stay two groups, ``NA`` or
    ``null`` is a name, and only an empty cell is missing. Parquet columns keep their stored type.

    Parameters
    ----------
    path : str or pathlib.Path
        The file (``.csv`` or ``.parquet``).
    what : str, optional
        What the file is, for messages.
    text_columns : tuple of str, optional
        CSV columns read as text.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    hbnn.errors.InputError
        If the file is missing, not a regular file, has a column twice, or cannot be parsed.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a folder, a pipe (which would be read until it closes), a device
        raise InputError(f"{what} {path} is not a regular file; give the path of a CSV or Parquet file")
    if not path.is_file():
        # `dvc exp run --temp` (and --queue) runs in a copy of what git or DVC tracks: a table that is neither is
        # missing there though it is in the workspace
        if what == "table":
            raise InputError(f"table {path} (data.path) does not exist (`dvc exp run --temp` and `--queue` see only "
                             "files that git or DVC tracks: commit the table or `dvc add` it)")
        raise InputError(f"{what} {path} does not exist")
    try:
        if path.suffix.lower() != ".csv":
            return pd.read_parquet(path)
        header = pd.read_csv(path, header=None, nrows=1, dtype=str, keep_default_na=False)
        names = header.iloc[0].tolist() if len(header) else []
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # pandas would rename the second to 'name.1' and go on with the first
            raise InputError(f"{what} {path} has the {plural('column', len(twice))} "
                             f"{', '.join(map(repr, twice))} more than once; each column needs its own name")
        df = pd.read_csv(path)
        text = [c for c in text_columns if c in df.columns]
        if text:
            raw = pd.read_csv(path, usecols=text, dtype=str, keep_default_na=False)
            for c in text:
                df[c] = raw[c].where(raw[c] != "", None)
        return df
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - any parse failure means a bad file
        raise InputError(f"{what} {path} is not a readable {path.suffix} file ({type(err).__name__}: {err})") from err


def check_columns(df: pd.DataFrame, columns: list[tuple[str, str]], where: str) -> None:
    """Check that every column exists.

    Parameters
    ----------
    df : pandas.DataFrame
    columns : list of tuple of str
        ``(role, name)`` pairs; the role (``data.label``...) is for the message.
    where : str
        The table, for messages.

    Raises
    ------
    hbnn.errors.InputError
        Naming the first missing column and its role.
    """
    for role, name in columns:
        if name not in df.columns:
            raise InputError(f"{where} has no column {name!r} ({role}); its columns are {list(map(str, df.columns))}")


def numeric_features(df: pd.DataFrame, features: list[str], where: str) -> np.ndarray:
    """The feature columns as a float array: numeric and complete.

    Parameters
    ----------
    df : pandas.DataFrame
    features : list of str
        The feature columns.
    where : str
        The table, for messages.

    Returns
    -------
    numpy.ndarray
        ``(n, feature)`` float64.

    Raises
    ------
    hbnn.errors.InputError
        Naming a column that is not numeric, or its missing or infinite values' rows.
    """
    for name in features:
        col = df[name]
        kind = _not_real(col)
        if kind:
            raise InputError(f"{where}: feature column {name!r} holds {kind}; encode it as real numbers first")
        if not (pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)):
            bad = np.flatnonzero(pd.to_numeric(col, errors="coerce").isna() & col.notna())
            example = col.iloc[bad[0]] if bad.size else col.dropna().iloc[0] if col.notna().any() else None
            raise InputError(f"{where}: feature column {name!r} is not numeric (e.g. {example!r} in row "
                             f"{rows_text(bad, 1) if bad.size else '?'}); encode it as numbers first")
        missing = np.flatnonzero(col.isna().to_numpy())
        if missing.size:
            raise InputError(f"{where}: feature column {name!r} has {counted(missing.size, 'missing value')} "
                             f"({rows_phrase(missing)}); drop or impute those rows first")
    X = df[features].to_numpy(dtype=np.float64)
    inf = np.argwhere(~np.isfinite(X))
    if inf.size:
        raise InputError(f"{where}: feature column {features[inf[0, 1]]!r} has a non-finite value in row "
                         f"{rows_text(inf[:, 0], 1)}")
    return X


def _not_real(col: pd.Series) -> str | None:
    """What a column holds where NumPy would turn it into real numbers by losing something (complex numbers lose
    their imaginary part, dates and durations become nanoseconds); ``None`` for any other column."""
    if pd.api.types.is_complex_dtype(col):
        return "complex numbers"
    if pd.api.types.is_datetime64_any_dtype(col) or isinstance(col.dtype, pd.PeriodDtype):
        return "dates"
    if pd.api.types.is_timedelta64_dtype(col):
        return "durations"
    return None


def group_column(df: pd.DataFrame, name: str, where: str) -> np.ndarray:
    """Group names as strings, each checked.

    A missing group value, or a name that is not printable text, not empty and at most
    :data:`hbnn.names.MAX_NAME_LENGTH` characters (:func:`hbnn.names.name_problem`), is refused. Checked once here,
    where a table's groups are read (``make_data``, ``check_params``, ``hbnn predict``): a NUL would cut the name short
    in ``data/tasks.nc`` (netCDF strings end at one) and merge two groups, a newline would break every table and line
    the name is written in. Each distinct name is checked once.

    Parameters
    ----------
    df : pandas.DataFrame
    name : str
        The group column.
    where : str
        The table, for messages.

    Returns
    -------
    numpy.ndarray
        The group name per row.

    Raises
    ------
    hbnn.errors.InputError
        Naming the column and the rows of a missing or bad name.
    """
    col = df[name]
    missing = np.flatnonzero(col.isna().to_numpy())
    if missing.size:
        raise InputError(f"{where}: group column {name!r} has {counted(missing.size, 'missing value')} "
                         f"({rows_phrase(missing)})")
    v = col.to_numpy()
    if pd.api.types.is_float_dtype(col) and np.all((np.mod(v, 1) == 0) & (np.abs(v) < 2**53)):
        col = col.astype(np.int64)  # 3.0 (an integer column that once held a NaN) names the group 3 names
    values = col.astype(str).to_numpy()
    for group in pd.unique(values):
        problem = name_problem(group)
        if problem is not None:
            rows = np.flatnonzero(values == group)
            raise InputError(f"{where}: group column {name!r} has a group name that cannot be used: "
                             f"{_shown(group)} in {rows_phrase(rows)}: the name {problem}")
    return values


def _shown(name: str, limit: int = 60) -> str:
    """``repr(name)``, its middle cut out past ``limit`` characters: an error line stays one readable line."""
    text = repr(name)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-(limit // 2):]}"


def _labels(df: pd.DataFrame, name: str, likelihood: str, where: str) -> np.ndarray:
    col = df[name]
    missing = np.flatnonzero(col.isna().to_numpy())
    if missing.size:
        raise InputError(f"{where}: label column {name!r} has {counted(missing.size, 'missing value')} "
                         f"({rows_phrase(missing)})")
    kind = _not_real(col)
    if kind:
        raise InputError(f"{where}: label column {name!r} holds {kind}; labels must be real numbers")
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(np.isnan(values))  # not missing (checked above): not a number
    if bad.size:
        raise InputError(f"{where}: label column {name!r} is not numeric (e.g. {col.iloc[bad[0]]!r} in row "
                         f"{rows_text(bad, 1)})")
    infinite = np.flatnonzero(np.isinf(values))
    if infinite.size:
        raise InputError(f"{where}: label column {name!r} has a non-finite value in row {rows_text(infinite, 1)}")
    return likelihoods.get(likelihood).check_labels(values, name, where)


def _split_column(df: pd.DataFrame, name: str, where: str) -> np.ndarray:
    col = df[name]
    values = col.astype(str).to_numpy()
    bad = np.flatnonzero(~np.isin(values, SPLITS) | col.isna().to_numpy())
    if bad.size:
        shown = sorted({str(v) for v in col.iloc[bad]})[:5]
        raise InputError(f"{where}: split column {name!r} must hold 'train' or 'test'; found {shown} in "
                         f"{rows_phrase(bad)}")
    return values


def group_key(name: str) -> int:
    """A group's stream key: the first 128 bits of the SHA-256 of its name (UTF-8).

    A group's random choices then depend on its name, not on where it sits in the file.

    Parameters
    ----------
    name : str

    Returns
    -------
    int
    """
    return int.from_bytes(hashlib.sha256(str(name).encode()).digest()[:16], "little")


def stratified_split(
    groups: np.ndarray, strata: np.ndarray, train_fraction: float, seed: int
) -> np.ndarray:
    """``"train"``/``"test"`` per row: within each group and stratum, a seeded random share trains.

    Each (group, stratum) cell of ``n`` rows sends ``round(n * train_fraction)`` rows, clipped to ``[1, n - 1]`` (``1``
    when ``n == 1``), to training; the rest are test rows. A group that still has no test row although it has >= 2 rows
    gives one training row of its largest cell to the test set. Each group draws from its own stream
    ``SeedSequence(seed, spawn_key=(group_key(name),))``, so a group's split depends only on ``seed``, its name and its
    own rows (in their order): adding, dropping or reordering other groups never changes it.

    Parameters
    ----------
    groups : numpy.ndarray
        The group name per row.
    strata : numpy.ndarray
        The stratum per row (the label for a classifier).
    train_fraction : float
        The share of each cell that trains.
    seed : int
        The params' ``seed``.

    Returns
    -------
    numpy.ndarray
        ``"train"`` or ``"test"`` per row.
    """
    codes, names = pd.factorize(groups)  # names in order of first appearance
    strata = np.asarray(strata)
    # One sort, then each (group, stratum) cell is a run of ``order``: its rows in stored order (a stable sort)
    order = np.lexsort((strata, codes))
    cell_code, cell_stratum = codes[order], strata[order]
    new_cell = np.ones(order.size, dtype=bool)
    new_cell[1:] = (cell_code[1:] != cell_code[:-1]) | (cell_stratum[1:] != cell_stratum[:-1])
    starts = np.flatnonzero(new_cell)
    ends = np.append(starts[1:], order.size)
    first_cell = np.searchsorted(cell_code[starts], np.arange(len(names) + 1))  # group g: cells [first[g], first[g+1])
    train = []
    for g, name in enumerate(names):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(group_key(name),)))
        train_rows = []
        for c in range(first_cell[g], first_cell[g + 1]):
            rows = rng.permutation(order[starts[c]:ends[c]])
            k = 1 if rows.size == 1 else min(max(round(rows.size * train_fraction), 1), rows.size - 1)
            train_rows.append(rows[:k])
        chosen = np.concatenate(train_rows)
        if chosen.size == ends[first_cell[g + 1] - 1] - starts[first_cell[g]] and chosen.size >= 2:
            largest = max(train_rows, key=len)
            chosen = chosen[chosen != largest[-1]]
        train.append(chosen)
    split = np.full(groups.size, "test", dtype=object)
    if train:
        split[np.concatenate(train)] = "train"
    return split.astype(str)


def _check_groups(names: np.ndarray, y: np.ndarray, split: np.ndarray, likelihood: str, where: str) -> None:
    """Every group has >= MIN_TRAIN_ROWS training rows, training labels its likelihood can fit, and a test row:
    each group's scores and its convergence bar (R-hat and ESS of its test-point predictions) are its test rows'."""
    lik = likelihoods.get(likelihood)
    codes, groups = pd.factorize(names)  # in order of first appearance
    train = np.flatnonzero(split == "train")
    rows, bounds = group_slices(codes[train], len(groups))
    train_rows = train[rows]  # group by group, each in stored order
    n_rows = np.bincount(codes, minlength=len(groups))
    for g, name in enumerate(groups):
        n, total = int(bounds[g + 1] - bounds[g]), int(n_rows[g])
        if n < MIN_TRAIN_ROWS:
            raise InputError(f"{where}: group {name!r} has {n} training rows (of {total}); "
                             f"each group needs at least {MIN_TRAIN_ROWS}. Drop the group or add rows")
        if n == total:
            raise InputError(f"{where}: group {name!r} has no test rows (all {n} of its rows are training rows); "
                             "each group needs at least 1, on which it is scored and its convergence judged. "
                             "Drop the group or mark some of its rows test in the split column (data.split)")
        lik.check_group(name, y[train_rows[bounds[g]:bounds[g + 1]]], where)


def _standardise(values: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column mean and sd over the training rows, and which columns are constant there.

    A constant column gets mean 0 and sd 1, i.e. it is left as it is: a column of
    ones then works as an intercept input of a network without biases (``model.bias: false``).
    """
    with np.errstate(all="ignore"):  # huge values overflow here; _model_scale reports them
        mean = values[train].mean(axis=0)
        sd = values[train].std(axis=0)
    constant = ~(sd > 0)
    return np.where(constant, 0.0, mean), np.where(constant, 1.0, sd), constant


# Model-scale values beyond this overflow the network's arithmetic (squares, sums over rows).
MAX_MODEL_SCALE = 1e100


def _model_scale(values, mean, sd, names: list[str], role: str, where: str) -> np.ndarray:
    """``(values - mean) / sd``, or an :class:`InputError` naming the column whose values cannot be used.

    Finite but huge values (1e308) overflow the mean or sd and would become NaN.
    """
    with np.errstate(all="ignore"):
        scaled = (values - mean) / sd
    bad = ~(np.isfinite(scaled) & (np.abs(scaled) <= MAX_MODEL_SCALE))
    # a training value whose square overflows makes the sd inf and every value of the column 0: finite, but wrong
    overflowed = ~(np.isfinite(mean) & np.isfinite(sd))
    if overflowed.any():
        column = int(np.flatnonzero(overflowed)[0])
        bad = np.zeros_like(bad)
        bad[int(np.argmax(np.abs(values[:, column]))), column] = True
    if bad.any():
        column, rows = int(np.flatnonzero(bad.any(axis=0))[0]), np.flatnonzero(bad.any(axis=1))
        raise InputError(f"{where}: {role} column {names[column]!r} has values too large to use (e.g. "
                         f"{float(values[rows[0], column])!r} in row {rows_text(rows, 1)}); rescale the column first")
    return scaled


def load_table_tasks(spec: DataSpec) -> xr.Dataset:
    """The user's table (``data.path``) as long-layout tasks (:func:`frame_tasks`).

    Parameters
    ----------
    spec : hbnn.data.spec.DataSpec
        Its ``data`` names the file and its columns.

    Returns
    -------
    xarray.Dataset
        The tasks in the long layout.

    Raises
    ------
    hbnn.errors.InputError
        Naming the file, column, row or group that cannot be used.
    """
    d = spec.data
    df = read_table(d.path, text_columns=(d.group,))
    return frame_tasks(df, spec, f"table {d.path}", table=str(d.path))


def frame_tasks(df: pd.DataFrame, spec: DataSpec, where: str, all_train: bool = False, table: str = "") -> xr.Dataset:
    """A table's rows as long-layout tasks: the columns ``spec.data`` names, checked, split and standardised.

    Checks, in this order, each failing with an :class:`InputError` that names
    the column or group: the columns exist; features are numeric and complete;
    labels are complete, numeric and valid for the likelihood (0/1 for
    ``bernoulli``); group names are complete and usable names (printable text,
    :func:`group_column`); a ``split`` column holds only
    ``train``/``test``; every group has at least 2 training rows and training
    labels its likelihood can fit (``bernoulli``: both classes). Without a
    split column each group is split by :func:`stratified_split` (strata: the
    likelihood's, the label for ``bernoulli``). With ``data.standardize``,
    features (and labels, where the likelihood standardises them) are
    standardised with training-row statistics, stored with the data.

    Parameters
    ----------
    df : pandas.DataFrame
        The rows.
    spec : hbnn.data.spec.DataSpec
        Its ``data`` names the columns (features, label, group, split), the train fraction and whether to
        standardise; ``likelihood`` checks the labels; ``seed`` seeds the split.
    where : str
        The table's name in error messages.
    all_train : bool, optional
        Every row trains, and each group is judged (convergence) and scored on its training inputs: the rows are
        stored again as the test split. For fits without held-out rows (the Python API without ``split``).
    table : str, optional
        The file the rows come from, recorded in the tasks' attrs.

    Returns
    -------
    xarray.Dataset
        The tasks in the long layout.

    Raises
    ------
    hbnn.errors.InputError
        Naming the column, row or group that cannot be used.
    """
    d = spec.data
    likelihood = spec.likelihood
    roles = [(f"data.features[{i}]", f) for i, f in enumerate(d.features)]
    roles += [("data.label", d.label), ("data.group", d.group)] + ([("data.split", d.split)] if d.split else [])
    check_columns(df, roles, where)
    if len(df) == 0:
        raise InputError(f"{where} has no rows")
    features = list(d.features)
    X = numeric_features(df, features, where)
    y = _labels(df, d.label, likelihood, where)
    names = group_column(df, d.group, where)
    if all_train:
        split = np.full(len(df), "train")
    elif d.split:
        split = _split_column(df, d.split, where)
    else:
        strata = likelihoods.get(likelihood).strata(y)
        split = stratified_split(names, strata, d.train_fraction, spec.seed)
    twice = (lambda a: np.concatenate([a, a])) if all_train else (lambda a: a)  # the rows again, as the test split
    _check_groups(twice(names), twice(y), np.repeat(["train", "test"], len(df)) if all_train else split, likelihood,
                  where)
    train = split == "train"
    x_mean, x_sd = np.zeros(X.shape[1]), np.ones(X.shape[1])
    y_mean, y_sd = 0.0, 1.0
    if d.standardize:
        x_mean, x_sd, constant = _standardise(X, train)
        for name in np.asarray(features)[constant]:
            log.warning("feature %r is constant over the training rows; it is left unscaled", str(name))
        if likelihoods.get(likelihood).standardise_labels:
            (y_mean,), (y_sd,), _ = _standardise(y[:, None], train)
    X_model = _model_scale(X, x_mean, x_sd, features, "feature", where)
    y_model = _model_scale(y[:, None], y_mean, y_sd, [d.label], "label", where)[:, 0]  # stored as label_dtype
    if all_train:
        split = np.repeat(["train", "test"], len(df))
    ds = tasks_dataset(
        twice(X_model),
        twice(y_model),
        twice(names),
        split,
        features,
        likelihood=likelihood,
        x_mean=x_mean,
        x_sd=x_sd,
        y_mean=y_mean,
        y_sd=y_sd,
    )
    ds.attrs.update({"source": "table", "table": table, "group_column": d.group, "label_column": d.label})
    if all_train:
        ds.attrs["test_rows"] = "training inputs"
    return ds
