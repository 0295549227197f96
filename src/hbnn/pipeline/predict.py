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

Output columns (appended to the input's): ``mean``, ``sd``, ``lower_94``, ``upper_94`` and ``unseen_group``, as the
likelihood summarises its draws (:meth:`hbnn.model.likelihoods.Likelihood.summarise`). Bernoulli: posterior mean, sd
and central 94% interval of ``P(y = 1)``. Gaussian and counts: the posterior predictive of ``y`` in the label's units,
noise included (mean, sd and central 94% interval of the mixture over draws; counts' interval in whole counts).

Rows are scored in chunks (:func:`hbnn.pipeline.chunking.chunk_rows`) so that memory stays within
:data:`hbnn.pipeline.chunking.SCORING_BUDGET` whatever the number of rows; a trace whose smallest chunk would not fit
is refused before any row is scored. Each row's numbers are computed from its own draws only, so they do not depend
on the chunks.
"""

from __future__ import annotations

import codecs
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from hbnn.config import PARQUET_SUFFIXES, TABLE_SUFFIXES
from hbnn.data.tables import check_columns, group_column, numeric_features, read_table
from hbnn.diagnostics.predictions import group_extra, group_weights, predict_output
from hbnn.errors import counted, rows_phrase
from hbnn.files import integrity
from hbnn.files.io import InputError, settings_from_attrs
from hbnn.files.outputs import staged_outputs
from hbnn.model import activations, likelihoods
from hbnn.model.network import LayerSpec, layer_specs
from hbnn.model.prior import layer_arrays
from hbnn.pipeline.chunking import chunk_rows, chunks, size_text
from hbnn.pipeline.variants import BY_NAME

log = logging.getLogger(__name__)

OUTPUT_COLUMNS = ("mean", "sd", "lower_94", "upper_94", "unseen_group")


def population_extra(posterior, name: str, rng: np.random.Generator) -> np.ndarray:
    """The likelihood's extra parameter for a new group, per posterior draw.

    Parameters
    ----------
    posterior : xarray.Dataset
        A hierarchical trace's posterior.
    name : str
        The parameter (gaussian's ``sigma``).
    rng : numpy.random.Generator
        Source of ``eps ~ N(0, 1)``, used only where the parameter is per group.

    Returns
    -------
    numpy.ndarray
        ``(chain, draw)``: the one shared by all groups, or, where it is one per group (``model.noise: group``), a new
        group's ``exp(log_<name>_mu + log_<name>_sd * eps)``.
    """
    if "group" not in posterior[name].dims:
        return posterior[name].transpose("chain", "draw").values
    mu = posterior[f"log_{name}_mu"].transpose("chain", "draw").values
    sd = posterior[f"log_{name}_sd"].transpose("chain", "draw").values
    return np.exp(mu + sd * rng.standard_normal(mu.shape))


@dataclass(frozen=True)
class Fitted:
    """The groups of a trace that prediction reads: ``posterior`` and ``constant_data`` (``None`` if absent).

    Read with xarray alone: importing ArviZ would be most of a small prediction's time (benchmarks/FINDINGS.md,
    "Measurements behind code comments").
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
    """Read a trace written by a fit stage, with the groups prediction needs.

    Parameters
    ----------
    path : pathlib.Path
        The trace (``traces/*.nc``).

    Returns
    -------
    Fitted
        Its ``posterior`` and ``constant_data`` groups, loaded into memory.

    Raises
    ------
    hbnn.errors.InputError
        If ``path`` is missing, not a regular file, an informed prior, unreadable, damaged, or of an unknown variant.
    """
    if path.exists() and not path.is_file():
        raise InputError(f"trace {path} is not a regular file; pass a fit's trace (traces/*.nc)")
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
        problem = " ".join(str(err).split())  # one line, whatever the library's message
        raise InputError(f"trace {path} is not a readable NetCDF trace ({type(err).__name__}: {problem[:200]})") \
            from err
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
    """Draw one new-group network per posterior draw: ``w = mu + sd_layer * eps``.

    Parameters
    ----------
    posterior : xarray.Dataset
        A hierarchical trace's posterior (``mu_*`` and ``sd_*`` variables).
    specs : list of hbnn.model.network.LayerSpec
    rng : numpy.random.Generator
        Source of ``eps ~ N(0, 1)``.

    Returns
    -------
    list of numpy.ndarray
        Per layer, the weights ``(chain, draw, *shape)``.
    """
    mu = layer_arrays(posterior, specs, "mu")
    out = []
    for s, m in zip(specs, mu, strict=True):
        sd = posterior[f"sd_{s.name}"].transpose("chain", "draw").values
        out.append(m + sd.reshape(*sd.shape, *([1] * len(s.shape))) * rng.standard_normal(m.shape))
    return out


def predict_table(trace, table: pd.DataFrame, where: str, seed: int = 0, budget: int | None = None
                  ) -> pd.DataFrame:
    """Score every row of ``table`` with a fitted trace.

    Parameters
    ----------
    trace, table, where, seed, budget
        As :func:`score_columns`.

    Returns
    -------
    pandas.DataFrame
        The table plus the output columns (:func:`score_columns`, rounded to 6 decimals).

    Raises
    ------
    hbnn.errors.InputError
        As :func:`score_columns`.
    """
    out = table.copy()
    for c, values in score_columns(trace, table, where, seed, budget).items():
        # 6 decimals: far below posterior Monte Carlo error; keeps the CSV readable
        out[c] = values if c == "unseen_group" else values.round(6)
    return out


def score_columns(trace, table: pd.DataFrame, where: str, seed: int = 0, budget: int | None = None
                  ) -> dict[str, np.ndarray]:
    """Compute the output columns of :func:`predict_table` for every row of ``table``, unrounded.

    All checks (columns, values, unseen groups on flat/informed traces, the memory of
    :func:`hbnn.pipeline.chunking.chunk_rows`) happen before any row is scored. The new-group draws of unseen groups
    are drawn once, before the chunks, so the output does not depend on ``budget``.

    Parameters
    ----------
    trace : str, pathlib.Path, Fitted or arviz.InferenceData
        The fitted trace, or its path.
    table : pandas.DataFrame
        Rows to score (the trace's feature and group columns); ``where`` names it in error messages.
    where : str
    seed : int, optional
        Seed of the new-group draws for unseen groups.
    budget : int, optional
        Bytes the scoring arrays may hold; default :data:`hbnn.pipeline.chunking.SCORING_BUDGET`.

    Returns
    -------
    dict of str to numpy.ndarray
        One array per name in :data:`OUTPUT_COLUMNS`, one value per row.

    Raises
    ------
    hbnn.errors.InputError
        Naming the column, groups or memory estimate: columns missing or clashing with the outputs, no rows,
        unseen groups on a flat or informed trace, a trace too large to score, or predictions that overflow.
    """
    idata = load_fitted(Path(trace)) if isinstance(trace, (str, Path)) else trace
    post = idata.posterior
    variant = post.attrs["hbnn_variant"]
    settings = settings_from_attrs(post.attrs)
    features = [str(f) for f in (settings.get("features") or post["feature"].values)]
    hidden = settings.get("hidden_layers", [])
    bias = bool(settings.get("bias", False))
    lik = likelihoods.get(settings.get("likelihood", "bernoulli"))
    activation = str(settings.get("activation", "tanh"))  # traces written before model.activation are tanh's
    activations.get(activation)  # an unknown name is one error line
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
    _, counts = np.unique(groups, return_counts=True)
    samples = post.sizes["chain"] * post.sizes["draw"]
    plan = chunk_rows(samples, sum(s.size for s in specs), lik.name, int(counts.max()), budget)
    log.info("predict: %s x %s draws, in chunks of up to %s (~%s each)", counted(len(table), "row"),
             f"{samples:,}", counted(plan.rows, "row"), size_text(plan.peak))
    population = population_weights(post, specs, np.random.default_rng(seed)) if unseen else None
    new_extra = None  # a new group's noise sd (or dispersion) per draw: drawn once, for every unseen group
    if unseen and lik.extra:
        new_extra = population_extra(post, lik.extra, np.random.default_rng((seed, 1)))
    columns = {c: np.empty(len(table)) for c in OUTPUT_COLUMNS[:-1]}
    for name in pd.unique(groups):
        rows = np.flatnonzero(groups == name)
        is_new = name in unseen
        weights = population if is_new else group_weights(post, specs, name)
        noise = None
        if lik.extra:  # unseen groups of the hierarchical model: the population's (population_extra)
            extra = new_extra if is_new else group_extra(post, lik.extra, name)
            noise = lik.extra_in_label_units(extra, y_sd).reshape(-1)
        bad = [_score_chunk(lik, activation, weights, noise, Xs, rows[part], (y_mean, y_sd), columns,
                            plan.summary_rows)
               for part in chunks(rows.size, plan.rows)]
        bad = np.concatenate(bad)
        if bad.size:
            raise InputError(f"{where}: the predictions of group {name!r} overflow at {rows_phrase(bad)} (features "
                             "far outside the training range?); nothing was written")
        log.info("predict: group %s, %s, %s", name, counted(rows.size, "row"),
                 "population (unseen)" if is_new else "own posterior")
    columns["unseen_group"] = np.isin(groups, unseen)
    if not lik.classifier and np.issubdtype(lik.label_dtype, np.integer):  # counts: the interval in whole counts
        columns.update({c: columns[c].astype(np.int64) for c in ("lower_94", "upper_94")})
    return columns


def _score_chunk(lik, activation: str, weights, noise, Xs: np.ndarray, rows: np.ndarray,
                 label_stats: tuple[float, float], columns: dict[str, np.ndarray], summary_rows: int) -> np.ndarray:
    """Score ``rows`` of ``Xs`` with per-layer ``weights`` draws (hidden units of ``activation``) into ``columns``
    (summarised ``summary_rows`` at a time); returns the rows whose numbers are not finite (an overflow), which the
    caller refuses."""
    output = predict_output(weights, Xs[rows], activation)
    bad = []
    for part in chunks(rows.size, summary_rows):
        draws = lik.mean(output[..., part], *label_stats)
        with np.errstate(all="ignore"):  # overflow (a rate of inf) is reported by the caller, naming the rows
            result = lik.summarise(draws.reshape(-1, draws.shape[-1]), noise)
        del draws
        for c, values in result.items():
            columns[c][rows[part]] = values
        bad.append(rows[part][~np.all([np.isfinite(v) for v in result.values()], axis=0)])
    return np.concatenate(bad)


STDOUT = Path("-")


def _check_output(output: Path, trace: Path, input_path: Path) -> Path:
    """Where to write ``output``: a file path that is neither the trace nor the input (``-`` is standard output),
    through any symbolic link (the file is replaced atomically, so a link must name it: the link stays).

    The name must end in .csv, .parquet or .pq (the format written), and an existing file there must be a table
    of that format (:func:`_not_a_table`): another trace, or any other file, is refused rather than replaced.
    """
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
    if output.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"--output {output} must end in .csv, or .parquet or .pq for Parquet (or be - for standard "
                         "output)")
    if output.exists():
        try:
            found = _not_a_table(target, parquet=output.suffix.lower() in PARQUET_SUFFIXES)
        except OSError as err:
            raise InputError(f"--output {output} exists but cannot be read ({err.strerror or err})") from None
        if found:
            raise InputError(f"--output {output} exists and is {found}, not a "
                             f"{'Parquet' if output.suffix.lower() in PARQUET_SUFFIXES else 'CSV'} table; writing "
                             "there would destroy it. Choose another path (or - for standard output)")
    return target


MAGIC = ((b"\x89HDF\r\n\x1a\n", "an HDF5 or NetCDF-4 file (a trace?)"), (b"CDF\x01", "a NetCDF file (a trace?)"),
         (b"CDF\x02", "a NetCDF file (a trace?)"), (b"CDF\x05", "a NetCDF file (a trace?)"),
         (b"PAR1", "a Parquet file"))
SNIFF_BYTES = 64 * 1024  # how much of an existing --output is read to tell a text table from another file


def _not_a_table(path: Path, parquet: bool) -> str | None:
    """What the existing file ``path`` is where it is not a table hbnn predict may replace (``None`` where it is one,
    or empty): a Parquet output must replace a Parquet file, a CSV output a text file (UTF-8, no NUL bytes)."""
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if not head:
        return None
    named = next((what for magic, what in MAGIC if head.startswith(magic)), None)
    if parquet:
        return None if head.startswith(b"PAR1") else named or ("a text file" if _is_text(head) else
                                                               "a file of another format")
    if named:
        return named
    if b"\0" in head:
        return "a binary file"
    return None if _is_text(head) else "not UTF-8 text"


def _is_text(head: bytes) -> bool:
    """Whether ``head`` (a file's first :data:`SNIFF_BYTES`) is UTF-8 text without NUL bytes; a character cut off
    at the end of a long file's head does not count against it."""
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < SNIFF_BYTES)
    except UnicodeDecodeError:
        return False
    return True


def predict(trace: Path, input_path: Path, output: Path, seed: int = 0) -> pd.DataFrame:
    """Read a table, score it with a trace and write the result atomically.

    Parameters
    ----------
    trace, input_path : pathlib.Path
        The fitted trace (``traces/*.nc``); the rows to score, CSV or Parquet.
    output : pathlib.Path
        Parquet where its name ends in ``.parquet`` or ``.pq``, CSV where it ends in ``.csv``; ``-`` writes the
        CSV to standard output.
    seed : int, optional
        Seed of the new-group draws for unseen groups.

    Returns
    -------
    pandas.DataFrame
        The scored table as written.

    Raises
    ------
    hbnn.errors.InputError
        If a suffix is not a table's, ``output`` is the trace, the input or an existing file that is not such a table
        (:func:`_check_output`), or as :func:`predict_table`.
    """
    if input_path.suffix.lower() not in TABLE_SUFFIXES:
        raise InputError(f"input {input_path} must be a .csv or .parquet file")
    target = _check_output(output, trace, input_path)
    idata = load_fitted(trace)
    group_col = settings_from_attrs(idata.posterior.attrs).get("group_column", "group")
    table = read_table(input_path, what="input", text_columns=(group_col,))
    scored = predict_table(idata, table, f"input {input_path}", seed)
    if output == STDOUT:
        scored.to_csv(sys.stdout, index=False)
        sys.stdout.flush()
    else:
        with staged_outputs() as outputs, outputs.path(target) as tmp:  # pandas writes the file a block at a time
            if output.suffix.lower() in PARQUET_SUFFIXES:
                scored.to_parquet(tmp, index=False)
            else:
                scored.to_csv(tmp, index=False)
    log.info("predict: wrote %s (%s, %s)", "standard output" if output == STDOUT else output,
             counted(len(scored), "row"), counted(int(scored["unseen_group"].sum()), "unseen-group row"))
    return scored
