"""``hbnn summarise``: mean and sd of every metric across DVC experiments (replicates over seeds).

Reads the JSON of ``dvc exp show --json`` (a list of revisions: the workspace, then each baseline commit with its
experiments under ``experiments[].revs[]``). Every commit and experiment that has metrics is one replicate, the
workspace is left out (it repeats a commit or holds unfinished results) unless asked for. The params that differ
between the replicates are reported, so a table that mixes settings says so.

The containers DVC writes (the list of revisions, each revision, ``experiments``, ``revs``, ``data``, ``metrics``,
``params`` and each file's entry) must have DVC's types, else :class:`InputError` names where the input departs from
it; what a metrics or params file holds is the user's and is read as it is (a value that is not a number is not a
metric).

Non-finite metrics follow IEEE arithmetic, one rule for mean, sd, min and max: a NaN value makes all four NaN (shown
``nan``); an infinite value is an ordinary, ordered value (min and max include it, the mean is infinite or, with both
signs, NaN, and the sd NaN). The Markdown table lists which replicates hold non-finite values. An integer too large
for a float is refused.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hbnn.errors import InputError
from hbnn.pipeline.variants import VARIANTS

DEFAULT_METRICS = ("metrics/*",)  # the pipeline's results; --metrics adds any other metrics file a user declares
# `dvc exp show --json` nests ~12 levels (revision, experiments, revs, data, metrics, file, data, then the file's
# own keys): far deeper input is not its output, and would exhaust Python's recursion in json.dumps
MAX_DEPTH = 100
NOT_EXP_SHOW = "the input is not the output of `dvc exp show --json`"


@dataclass(frozen=True)
class Replicate:
    """One commit or experiment with metrics: its name, numeric metrics and params, keyed ``file:dotted.key``."""
    name: str  # experiment name, or the commit's short hash
    metrics: dict[str, float]  # "file:dotted.key" -> value (numbers only)
    params: dict[str, Any]  # "file:dotted.key" -> value


def flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``("a.b.c", value)`` for every leaf of nested dicts (a list is a leaf), depth first in key order.

    Parameters
    ----------
    node : Any
    prefix : str, optional
        Dotted key of ``node`` itself.
    """
    stack = [(prefix, node)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(reversed([(f"{key}.{k}" if key else str(k), v) for k, v in value.items()]))
        else:
            yield key, value


def _kind(value: Any) -> str:
    """What a JSON value is, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a number")


def _bad(where: str, value: Any, expected: str) -> InputError:
    return InputError(f"{NOT_EXP_SHOW}: {where} is {_kind(value)}, expected {expected}")


def _obj(value: Any, where: str) -> dict:
    """An object of DVC's format (null: empty), or :class:`InputError` naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(where, value, "an object")
    return value


def _list(value: Any, where: str) -> list:
    """A list of DVC's format (null: empty), or :class:`InputError` naming ``where``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(where, value, "a list")
    return value


def _text(value: Any, where: str) -> str:
    """A name, hash or state of DVC's format (null: ``""``), or :class:`InputError` naming ``where``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _bad(where, value, "a string")
    return value


def _depth_checked(doc: Any) -> None:
    """:class:`InputError` where ``doc`` nests deeper than :data:`MAX_DEPTH` (checked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{NOT_EXP_SHOW}: it nests more than {MAX_DEPTH} levels deep")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _files(section: Any, where: str) -> dict[str, Any]:
    """``"file:dotted.key" -> value`` of a ``metrics`` or ``params`` section (a file whose data is not an object is
    one value, keyed by the file)."""
    out = {}
    for path, content in _obj(section, where).items():
        entry = _obj(content, f"{where}[{json.dumps(path)}]")
        for key, value in flatten(entry.get("data")):
            out[f"{path}:{key}" if key else path] = value
    return out


def _number(value: Any, name: str, where: str) -> float | None:
    """A metric's value as a float (NaN and infinities kept), ``None`` where it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        raise InputError(f"{where}: metric {name} is an integer of {len(str(abs(value)))} digits, too large for a "
                         "float") from None


def _name(entry: dict, where: str) -> str:
    """A revision's name: its experiment or branch name, else its commit's short hash (``?`` without either)."""
    name = _text(entry.get("name"), f"{where}.name")
    rev = _text(entry.get("rev"), f"{where}.rev")
    return name or (rev[:7] if len(rev) == 40 else rev) or "?"


def _replicate(entry: dict, where: str) -> Replicate | None:
    data = _obj(entry.get("data"), f"{where}.data")
    name = _name(entry, where)
    if entry.get("error") or not data.get("metrics"):
        return None
    metrics = {}
    for key, value in _files(data["metrics"], f"{where}.data.metrics").items():
        number = _number(value, key, f"{where} ({name})")
        if number is not None:
            metrics[key] = number
    return Replicate(name, metrics, _files(data.get("params"), f"{where}.data.params"))


def replicates(exp_show: Any, workspace: bool = False) -> tuple[list[Replicate], list[str]]:
    """Collect every commit and finished experiment of ``dvc exp show --json`` output that has metrics.

    A queued or running experiment is left out: DVC lists it with its baseline's metrics files, which
    would count the baseline twice. So is a failed one.

    Parameters
    ----------
    exp_show : Any
        The parsed JSON of ``dvc exp show --json``.
    workspace : bool, optional
        Count the workspace as a replicate too.

    Returns
    -------
    tuple of (list of Replicate, list of str)
        The replicates in the input's order; the experiments left out, as ``"<name> (<state>)"``.

    Raises
    ------
    hbnn.errors.InputError
        Where the input departs from DVC's format, naming where (e.g. ``[1].experiments[0].revs``).
    """
    if not isinstance(exp_show, list):
        raise InputError(f"{NOT_EXP_SHOW} (expected a JSON list of revisions, found {_kind(exp_show)})")
    _depth_checked(exp_show)
    out, skipped = [], []
    for i, raw in enumerate(exp_show):
        where = f"[{i}]"
        if not isinstance(raw, dict):
            raise InputError(f"{NOT_EXP_SHOW} (revision {where} is {_kind(raw)}, not an object)")
        if raw.get("rev") != "workspace" or workspace:
            rep = _replicate(raw, where)
            if rep is not None:
                out.append(rep)
        for j, exp in enumerate(_list(raw.get("experiments"), f"{where}.experiments")):
            at = f"{where}.experiments[{j}]"
            exp = _obj(exp, at)
            state = _text(_obj(exp.get("executor"), f"{at}.executor").get("state"), f"{at}.executor.state")
            state = state or "success"
            for k, rev in enumerate(_list(exp.get("revs"), f"{at}.revs")):
                rev_at = f"{at}.revs[{k}]"
                rev = _obj(rev, rev_at)
                rep = _replicate(rev, rev_at)
                if state != "success" or rep is None:
                    label = _text(exp.get("name"), f"{at}.name") or _name(rev, rev_at)
                    skipped.append(_plain(f"{label} ({'no metrics' if state == 'success' else state})"))
                else:
                    out.append(rep)
    return out, skipped


def named(reps: Sequence[Replicate], patterns: Sequence[str]) -> list[Replicate]:
    """Return the replicates whose name (experiment name, commit hash or branch) matches one of the globs.

    Parameters
    ----------
    reps : sequence of Replicate
    patterns : sequence of str
    """
    return [r for r in reps if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def differing_params(reps: Sequence[Replicate]) -> dict[str, list[Any]]:
    """Find the params whose values are not the same in every replicate.

    Parameters
    ----------
    reps : sequence of Replicate

    Returns
    -------
    dict of str to list
        ``file:key`` -> its value in each replicate (``None`` where absent).
    """
    keys = sorted({k for r in reps for k in r.params})
    return {k: [r.params.get(k) for r in reps] for k in keys if len({json.dumps(r.params.get(k)) for r in reps}) > 1}


@dataclass(frozen=True)
class Row:
    """One metric's summary over the replicates that have it (:func:`summarise`)."""
    metric: str
    n: int
    mean: float
    sd: float  # sample sd (n - 1); NaN with one value
    low: float
    high: float
    nonfinite: tuple[str, ...] = ()  # "<replicate>=<value>" for each NaN or infinite value


def moments(values: Sequence[float]) -> tuple[float, float]:
    """Return the mean and sample sd (NaN for one value) of ``values``, by IEEE arithmetic where one is NaN or inf.

    Finite values are scaled by the largest magnitude first, so that values near the float limit (1e308) give
    their mean and sd instead of overflowing.

    Parameters
    ----------
    values : sequence of float
    """
    n = len(values)
    if not all(math.isfinite(v) for v in values):
        mean = math.nan if any(math.isnan(v) for v in values) else sum(values) / n  # inf, or NaN for inf - inf
        return mean, math.nan
    scale = max(abs(v) for v in values) or 1.0
    scaled = [v / scale for v in values]
    mean = math.fsum(scaled) / n
    sd = math.sqrt(math.fsum((v - mean) * (v - mean) for v in scaled) / (n - 1)) * scale if n > 1 else math.nan
    return mean * scale, sd


def summarise(reps: Sequence[Replicate], patterns: Iterable[str] = DEFAULT_METRICS) -> list[Row]:
    """Return a :class:`Row` (mean, sd, min, max) per metric matching ``patterns``, over the replicates having it.

    Metrics come in first-seen order. A NaN value makes all four NaN; infinities are ordered values
    (:func:`moments`).

    Parameters
    ----------
    reps : sequence of Replicate
    patterns : iterable of str, default :data:`DEFAULT_METRICS`
        Globs on ``file:key``.
    """
    patterns = list(patterns)
    names: dict[str, None] = {}  # insertion-ordered set
    for r in reps:
        for k in r.metrics:
            if k not in names and any(fnmatch.fnmatchcase(k, p) for p in patterns):
                names[k] = None
    rows = []
    for name in names:
        have = [r for r in reps if name in r.metrics]
        values = [r.metrics[name] for r in have]
        mean, sd = moments(values)
        if any(math.isnan(v) for v in values):
            low = high = math.nan
        else:
            low, high = min(values), max(values)
        odd = tuple(f"{r.name}={r.metrics[name]}" for r in have if not math.isfinite(r.metrics[name]))
        rows.append(Row(name, len(values), mean, sd, low, high, odd))
    return rows


def _num(x: float) -> str:
    return f"{x:.4g}"  # nan, inf and -inf as Python writes them


def _plain(text: str) -> str:
    """``text`` on one line: line breaks and tabs (in names and keys from the input) as spaces."""
    return " ".join(text.replace("\t", " ").splitlines()) if text else text


def _cell_md(text: str) -> str:
    """``text`` inside a Markdown table cell: one line, ``|`` escaped."""
    return _plain(text).replace("|", "\\|")


def markdown(rows: Sequence[Row], reps: Sequence[Replicate], skipped: Sequence[str] = ()) -> str:
    """Return the table as Markdown, with the replicates, the experiments left out, the params they differ in and
    any non-finite values above it. The sd of a single value is ``n/a``; NaN shows as ``nan``.

    Parameters
    ----------
    rows : sequence of Row
    reps : sequence of Replicate
    skipped : sequence of str, optional
    """
    varied = differing_params(reps)
    head = [_plain(f"{len(reps)} replicates: {', '.join(r.name for r in reps)}"), ""]
    head += [_plain(f"- left out (not finished or no metrics): {', '.join(skipped)}")] if skipped else []
    head += [_plain(f"- params that differ: `{k}` = {', '.join(json.dumps(v) for v in vals)}")
             for k, vals in varied.items()]
    if not varied:
        head.append("- params that differ: none (the replicates repeat the same settings)")
    odd = [f"`{r.metric}`: {', '.join(r.nonfinite)}" for r in rows if r.nonfinite]
    if odd:
        head.append(_plain("- non-finite values (a NaN makes its metric's mean, sd, min and max nan): "
                           + "; ".join(odd)))
    lines = ["| metric | mean ± sd | min | max | n |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {_cell_md(r.metric)} | {_num(r.mean)} ± {'n/a' if r.n == 1 else _num(r.sd)} | {_num(r.low)} | "
              f"{_num(r.high)} | {r.n} |" for r in rows]
    return "\n".join([*head, "", *lines]) + "\n"


def csv(rows: Sequence[Row]) -> str:
    """Return CSV of ``metric,n,mean,sd,min,max`` rows (6 significant digits; ``nan``, ``inf``), quoted as needed.

    Parameters
    ----------
    rows : sequence of Row
    """
    return _csv_text([["metric", "n", "mean", "sd", "min", "max"],
                      *([r.metric, str(r.n), *(f"{x:.6g}" for x in (r.mean, r.sd, r.low, r.high))] for r in rows)])


def _csv_text(rows: Iterable[Sequence[str]]) -> str:
    import csv as csv_module
    import io

    out = io.StringIO()
    csv_module.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


# ----------------------------------------------------------------------------- hbnn headline
MODELS = tuple(v.stem for v in VARIANTS)  # metrics/<stem>.json of the three fit stages
# (column label, metrics key) per kind of number (classification's, then regression's): each that some row has gets a
# column, so classifiers and regressions side by side keep their own scores
SCORES = ((("acc", "test.accuracy"), ("rmse", "test.rmse")),
          (("logloss", "test.log_loss"), ("lpd", "test.lpd")),
          (("elpd", "loo.elpd"),),
          (("nc", "sampling.groups_not_converged"),))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def headline(reps: Sequence[Replicate]) -> tuple[list[str], list[list[str]]]:
    """Tabulate one row per replicate with the few numbers ``dvc exp show`` cannot fit in a terminal: per model
    (flat, hier, informed) the test score, log loss (or lpd), LOO elpd and groups not converged, and the params in
    which the rows differ (``key=value``). No wall-clock time: the fit stages' ``timings/*.json`` are neither DVC
    metrics nor in git, so that a rerun leaves ``git status`` clean. Rows of different likelihoods (classifiers and
    regressions) each keep their own scores: every score that some row has gets a column.

    Parameters
    ----------
    reps : sequence of Replicate

    Returns
    -------
    tuple of (list of str, list of list of str)
        The header and the rows.
    """
    columns: list[tuple[str, str]] = []  # (column label, "file:key" of its metric)
    for model in MODELS:
        for choices in SCORES:
            for label, key in choices:
                name = f"metrics/{model}.json:{key}"
                if any(name in r.metrics for r in reps):
                    columns.append((f"{model}:{label}", name))
    varied = differing_params(reps)
    header = ["experiment", *[label for label, _ in columns], PARAMS_COLUMN]
    rows = []
    for i, r in enumerate(reps):
        changed = " ".join(f"{k.removeprefix('params.yaml:')}={json.dumps(vals[i], separators=(',', ':'))}"
                           for k, vals in varied.items())
        rows.append([r.name, *[_cell(r.metrics.get(name)) for _, name in columns], changed or "-"])
    return header, rows


WIDTH = 160  # a terminal's width for `hbnn headline`: the table is cut into blocks and the params go below it
PARAMS_COLUMN = "params that differ"


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH) -> str:
    """The table as text no wider than ``width`` where it can be: numbers right-aligned, two spaces apart; a
    ``model:label`` header is split over two lines (the model once, above its columns).

    Where the models' columns together are wider than ``width`` (classifier and regression experiments side by
    side), they are printed in blocks of whole models, each block repeating the experiment column. The params in
    which the experiments differ (:func:`headline`'s last column) are listed under the table, one experiment a
    line, wrapped at ``width``.

    Parameters
    ----------
    header : sequence of str
    rows : sequence of sequence of str
        :func:`headline`'s header and rows.
    width : int, default :data:`WIDTH`

    Returns
    -------
    str
        The table's lines, then the params legend where any params differ.
    """
    import textwrap

    header, rows = list(header), [[_plain(c) for c in row] for row in rows]
    legend = []
    if header and header[-1] == PARAMS_COLUMN:
        legend = [(row[0], row[-1]) for row in rows if row[-1] != "-"]
        header, rows = header[:-1], [row[:-1] for row in rows]
    tops, labels = [], []
    for name in header:
        top, _, label = name.rpartition(":")
        tops.append(top)
        labels.append(label)
    table = [labels, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    # columns in groups of one model each (a column without a model is a group of its own), packed into blocks
    groups: list[list[int]] = []
    for i in range(1, len(header)):
        if groups and tops[i] and tops[i] == tops[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    blocks: list[list[int]] = [[]]
    used = widths[0] if header else 0
    for group in groups:
        need = sum(widths[i] + 2 for i in group)
        if blocks[-1] and used + need > width:
            blocks.append([])
            used = widths[0]
        blocks[-1].extend(group)
        used += need

    def line(cells: list[str], columns: list[int], left: bool = False) -> str:
        return "  ".join(cells[i].ljust(widths[i]) if left or i == 0 else cells[i].rjust(widths[i])
                         for i in columns).rstrip()

    firsts = {group[0] for group in groups}  # a model's name stands over its first column
    out = []
    for n, block in enumerate(blocks):
        columns = [0, *block] if header else []
        if n:
            out.append("")
        top_cells = [tops[i] if i in firsts else "" for i in range(len(header))]
        if any(top_cells[i] for i in columns):
            out.append(line(top_cells, columns, left=True))
        out.extend(line(row, columns) for row in table)
    if legend:
        out.extend(["", f"{PARAMS_COLUMN}:"])
        for name, changed in legend:
            out.extend(textwrap.wrap(f"{name}: {changed}", width, initial_indent="  ", subsequent_indent="      ",
                                     break_on_hyphens=False))
    return "\n".join(out) + "\n"


def headline_csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Return :func:`headline`'s ``header`` and ``rows`` (cells of text) as CSV text, quoted as needed.

    Parameters
    ----------
    header, rows : sequence
    """
    return _csv_text([header, *rows])
