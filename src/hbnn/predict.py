"""Score new rows with a fitted trace: ``hbnn predict --trace ... --input ... --output ...``.

A trace holds everything needed: the posterior, the layer layout, feature and
group-column names and likelihood (``hbnn_settings`` attrs) and the
standardisation statistics (``constant_data``). New rows are standardised with
the training statistics, then scored by every kept posterior draw:

- a group seen in training uses its own posterior weights;
- an unseen group, for the hierarchical model, uses the population: per
  posterior draw one new-group network ``w = mu + sd_layer * eps`` with
  ``eps ~ N(0, 1)`` drawn from ``--seed`` (all unseen groups share these draws:
  the model knows the same about any new group);
- an unseen group is an error for the flat and informed models, which have no
  group distribution.

Output columns (appended to the input's): ``mean``, ``sd``, ``lower_94``,
``upper_94`` and ``unseen_group``, as the likelihood summarises its draws
(:meth:`hbnn.likelihoods.Likelihood.summarise`). Bernoulli: posterior mean, sd
and central 94% interval of ``P(y = 1)``. Gaussian: the posterior predictive
of ``y`` in the label's units, noise included (mean, sd and central 94%
interval of the mixture over draws).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from hbnn import integrity, likelihoods
from hbnn.config import PARQUET_SUFFIXES, TABLE_SUFFIXES
from hbnn.data import check_columns, group_column, numeric_features, read_table
from hbnn.errors import counted, rows_phrase
from hbnn.evaluation import group_noise, group_weights, predict_output
from hbnn.io import InputError, settings_from_attrs, staged_outputs, write_text
from hbnn.network import LayerSpec, layer_specs
from hbnn.prior import layer_arrays
from hbnn.variants import BY_NAME

log = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("mean", "sd", "lower_94", "upper_94", "unseen_group")


@dataclass(frozen=True)
class Fitted:
    """The groups of a trace that prediction reads: ``posterior`` and ``constant_data`` (``None`` if absent).

    Read with xarray alone: ArviZ takes ~2 s to import, most of a small prediction's time.
    """

    posterior: xr.Dataset
    constant_data: xr.Dataset | None = None


def _is_prior(path: Path) -> bool:
    """Whether ``path`` is an informed prior (``priors/*.nc``), which holds its layers at the file's root."""
    try:
        with xr.open_dataset(path) as ds:
            return ds.attrs.get("hbnn_variant") == "informed_prior"
    except Exception:  # noqa: BLE001 - not readable at all: not a prior either
        return False


def load_fitted(path: Path) -> Fitted:
    """A trace written by a fit stage, with the groups prediction needs, or :class:`InputError`."""
    if not path.is_file():
        raise InputError(f"trace {path} does not exist; run the fit stages first (dvc repro)")
    try:
        with xr.open_dataset(path, group="posterior") as ds:
            posterior = ds.load()
        try:
            with xr.open_dataset(path, group="constant_data") as ds:
                constant = ds.load()
        except OSError:  # no such group: a trace written before constant_data existed
            constant = None
    except Exception as err:  # noqa: BLE001 - any decode failure means a bad file
        if _is_prior(path):
            raise InputError(f"{path} is an informed prior, not a trace: pass a fit's trace (traces/*.nc, e.g. "
                             "traces/hier.nc)") from err
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {err})") from err
    integrity.check(posterior, f"trace {path} (group posterior)")
    if constant is not None:
        integrity.check(constant, f"trace {path} (group constant_data)")
    variant = posterior.attrs.get("hbnn_variant")
    if variant not in BY_NAME:
        raise InputError(f"trace {path} holds model variant {variant!r}; hbnn predict needs one of {list(BY_NAME)}")
    return Fitted(posterior, constant)


def _stats(idata, n_features: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Standardisation statistics from ``constant_data`` (identity for traces written before they existed)."""
    const = getattr(idata, "constant_data", None)
    if const is None or "x_mean" not in const:
        return np.zeros(n_features), np.ones(n_features), 0.0, 1.0
    return (const["x_mean"].values, const["x_sd"].values, float(const["y_mean"]), float(const["y_sd"]))


def population_weights(posterior, specs: list[LayerSpec], rng: np.random.Generator) -> list[np.ndarray]:
    """One new-group network per posterior draw: ``w = mu + sd_layer * eps``, per layer ``(chain, draw, *shape)``."""
    mu = layer_arrays(posterior, specs, "mu")
    out = []
    for s, m in zip(specs, mu, strict=True):
        sd = posterior[f"sd_{s.name}"].transpose("chain", "draw").values
        out.append(m + sd.reshape(*sd.shape, *([1] * len(s.shape))) * rng.standard_normal(m.shape))
    return out


def predict_table(trace, table: pd.DataFrame, where: str, seed: int = 0) -> pd.DataFrame:
    """Score every row of ``table`` with the fitted ``trace`` (a path, a :class:`Fitted` or an ``InferenceData``).

    Returns the table plus the output columns.

    All checks (columns, values, unseen groups on flat/informed traces) happen
    before any row is scored; failures are :class:`InputError` naming the column
    or groups.
    """
    idata = load_fitted(Path(trace)) if isinstance(trace, (str, Path)) else trace
    post = idata.posterior
    variant = post.attrs["hbnn_variant"]
    settings = settings_from_attrs(post.attrs)
    features = [str(f) for f in (settings.get("features") or post["feature"].values)]
    hidden = settings.get("hidden_layers", [])
    bias = bool(settings.get("bias", False))
    lik = likelihoods.get(settings.get("likelihood", "bernoulli"))
    group_col = settings.get("group_column", "group")
    specs = layer_specs(len(features), hidden, bias)
    clash = [c for c in OUTPUT_COLUMNS if c in table.columns]
    if clash:
        raise InputError(f"{where} already has columns {clash}, which hbnn predict writes; rename them")
    check_columns(table, [("group column", group_col)] + [("feature", f) for f in features], where)
    if table.empty:
        raise InputError(f"{where} has no rows to score")
    X = numeric_features(table, features, where)
    groups = group_column(table, group_col, where)
    known = [str(g) for g in post["group"].values]
    unseen = sorted(set(groups) - set(known))
    if unseen and not BY_NAME[variant].has_group_distribution:
        raise InputError(f"{where} has groups {unseen} that the {variant} model was not fit to (it knows "
                         f"{known[:10]}{'...' if len(known) > 10 else ''}); only a hierarchical trace can score "
                         "unseen groups")
    x_mean, x_sd, y_mean, y_sd = _stats(idata, len(features))
    Xs = (X - x_mean) / x_sd
    population = population_weights(post, specs, np.random.default_rng(seed)) if unseen else None
    columns = {c: np.empty(len(table)) for c in OUTPUT_COLUMNS[:-1]}
    for name in pd.unique(groups):
        rows = np.flatnonzero(groups == name)
        is_new = name in unseen
        weights = population if is_new else group_weights(post, specs, name)
        draws = lik.mean(predict_output(weights, Xs[rows]), y_mean, y_sd)
        noise = None
        if lik.has_noise:  # unseen groups of the hierarchical model share its one sigma: the population's
            noise = (y_sd * group_noise(post, None if is_new else name)).reshape(-1)
        with np.errstate(all="ignore"):  # overflow (a rate of inf) is reported below, naming the rows
            result = lik.summarise(draws.reshape(-1, rows.size), noise)
        bad = ~np.all([np.isfinite(v) for v in result.values()], axis=0)
        if bad.any():
            raise InputError(f"{where}: the predictions of group {name!r} overflow at "
                             f"{rows_phrase(rows[bad])} (features far outside the training range?); nothing was "
                             "written")
        for c, values in result.items():
            columns[c][rows] = values
        log.info("predict: group %s, %s, %s", name, counted(rows.size, "row"),
                 "population (unseen)" if is_new else "own posterior")
    out = table.copy()
    for c, values in columns.items():
        out[c] = values.round(6)  # far below posterior Monte Carlo error; keeps the CSV readable
    out["unseen_group"] = np.isin(groups, unseen)
    return out


STDOUT = Path("-")


def _check_output(output: Path, trace: Path, input_path: Path) -> Path:
    """Where to write ``output``: a file path that is neither the trace nor the input (``-`` is standard output),
    through any symbolic link (the file is replaced atomically, so a link must name it: the link stays)."""
    if output == STDOUT:
        return output
    try:
        target = output.resolve()
    except (OSError, RuntimeError) as err:  # a loop of links (RuntimeError before Python 3.13)
        raise InputError(f"--output {output} cannot be followed to a file ({err})") from None
    for role, path in (("--trace", trace), ("--input", input_path)):
        if target == path.resolve():
            raise InputError(f"--output {output} is the {role} file; writing there would destroy it. "
                             "Choose another path (or - for standard output)")
    if output.is_dir():
        raise InputError(f"--output {output} is a directory; give a file path such as {output / 'scored.csv'}")
    # a pipe, a device, a socket (checked through the link as given: /dev/stdout's target has no path of its own):
    # the atomic rename would replace it with a regular file
    if output.exists() and not output.is_file():
        raise InputError(f"--output {output} is not a regular file; give a file path, or - for standard output")
    return target


def predict(trace: Path, input_path: Path, output: Path, seed: int = 0) -> pd.DataFrame:
    """Read ``input_path`` (CSV or Parquet), score it with ``trace`` and write ``output`` atomically: Parquet where
    its name ends in ``.parquet`` or ``.pq``, else CSV.

    ``output`` ``-`` writes the CSV to standard output.
    """
    if input_path.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"input {input_path} must be a .csv or .parquet file")
    target = _check_output(output, trace, input_path)
    idata = load_fitted(trace)
    group_col = settings_from_attrs(idata.posterior.attrs).get("group_column", "group")
    table = read_table(input_path, what="input", text_columns=(group_col,))
    scored = predict_table(idata, table, f"input {input_path}", seed)
    if output == STDOUT:
        sys.stdout.write(scored.to_csv(index=False))
        sys.stdout.flush()
    elif output.suffix.lower() in PARQUET_SUFFIXES:
        with staged_outputs() as outputs:
            outputs.write_bytes(scored.to_parquet(index=False), target)
    else:
        write_text(scored.to_csv(index=False), target)
    log.info("predict: wrote %s (%s, %s)", "standard output" if output == STDOUT else output,
             counted(len(scored), "row"), counted(int(scored["unseen_group"].sum()), "unseen-group row"))
    return scored
