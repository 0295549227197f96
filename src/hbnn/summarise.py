"""``hbnn summarise``: mean and sd of every metric across DVC experiments (replicates over seeds).

Reads the JSON of ``dvc exp show --json`` (a list of revisions: the
workspace, then each baseline commit with its experiments under
``experiments[].revs[]``). Every commit and experiment that has metrics is one
replicate, the workspace is left out (it repeats a commit or holds unfinished
results) unless asked for. The params that differ between the replicates are
reported, so a table that mixes settings says so.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hbnn.errors import InputError
from hbnn.variants import VARIANTS

DEFAULT_METRICS = ("metrics/*",)  # timings/* are wall-clock, not results: --metrics 'timings/*' adds them


@dataclass(frozen=True)
class Replicate:
    name: str  # experiment name, or the commit's short hash
    metrics: dict[str, float]  # "file:dotted.key" -> value (numbers only)
    params: dict[str, Any]  # "file:dotted.key" -> value


def flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("a.b.c", value)`` for every leaf of nested dicts."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _files(section: dict | None) -> dict[str, Any]:
    out = {}
    for path, content in (section or {}).items():
        for key, value in flatten((content or {}).get("data") or {}):
            out[f"{path}:{key}"] = value
    return out


def _replicate(entry: dict) -> Replicate | None:
    data = entry.get("data") or {}
    if entry.get("error") or not data.get("metrics"):
        return None
    metrics = {k: float(v) for k, v in _files(data["metrics"]).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    rev = str(entry.get("rev", ""))
    return Replicate(entry.get("name") or (rev[:7] if len(rev) == 40 else rev), metrics, _files(data.get("params")))


def replicates(exp_show: Any, workspace: bool = False) -> tuple[list[Replicate], list[str]]:
    """Every commit and finished experiment of ``dvc exp show --json`` output that has metrics, in its order;
    and the experiments left out, as ``"<name> (<state>)"``.

    A queued or running experiment is left out: DVC lists it with its baseline's metrics files, which
    would count the baseline twice. So is a failed one.
    """
    if not isinstance(exp_show, list):
        raise InputError("the input is not the output of `dvc exp show --json` (expected a JSON list of revisions)")
    out, skipped = [], []
    for entry in exp_show:
        if not isinstance(entry, dict):
            raise InputError("the input is not the output of `dvc exp show --json` (a revision is not an object)")
        if entry.get("rev") != "workspace" or workspace:
            rep = _replicate(entry)
            if rep is not None:
                out.append(rep)
        for exp in entry.get("experiments") or []:
            state = (exp.get("executor") or {}).get("state", "success")
            for rev in exp.get("revs") or []:
                rep = _replicate(rev)
                if state != "success" or rep is None:
                    skipped.append(f"{exp.get('name') or rev.get('name') or rev.get('rev', '?')[:7]} "
                                   f"({'no metrics' if state == 'success' else state})")
                else:
                    out.append(rep)
    return out, skipped


def named(reps: Sequence[Replicate], patterns: Sequence[str]) -> list[Replicate]:
    """The replicates whose name (experiment name, commit hash or branch) matches one of the globs."""
    return [r for r in reps if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def differing_params(reps: Sequence[Replicate]) -> dict[str, list[Any]]:
    """Params whose values are not the same in every replicate: key -> value per replicate."""
    keys = sorted({k for r in reps for k in r.params})
    return {k: [r.params.get(k) for r in reps] for k in keys if len({json.dumps(r.params.get(k)) for r in reps}) > 1}


@dataclass(frozen=True)
class Row:
    metric: str
    n: int
    mean: float
    sd: float  # sample sd (n - 1); NaN with one value
    low: float
    high: float


def summarise(reps: Sequence[Replicate], patterns: Iterable[str] = DEFAULT_METRICS) -> list[Row]:
    """Mean, sd, min and max of each metric matching ``patterns`` (globs on ``file:key``) over the replicates
    that have it, in first-seen order."""
    patterns = list(patterns)
    names: list[str] = []
    for r in reps:
        names += [k for k in r.metrics if k not in names and any(fnmatch.fnmatchcase(k, p) for p in patterns)]
    rows = []
    for name in names:
        values = [r.metrics[name] for r in reps if name in r.metrics]
        n = len(values)
        mean = sum(values) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
        rows.append(Row(name, n, mean, sd, min(values), max(values)))
    return rows


def _num(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4g}"


def markdown(rows: Sequence[Row], reps: Sequence[Replicate], skipped: Sequence[str] = ()) -> str:
    """The table as Markdown, with the replicates, the experiments left out and the params they differ in above
    it."""
    varied = differing_params(reps)
    head = [f"{len(reps)} replicates: {', '.join(r.name for r in reps)}", ""]
    head += [f"- left out (not finished or no metrics): {', '.join(skipped)}"] if skipped else []
    head += [f"- params that differ: `{k}` = {', '.join(json.dumps(v) for v in vals)}" for k, vals in varied.items()]
    if not varied:
        head.append("- params that differ: none (the replicates repeat the same settings)")
    lines = ["| metric | mean ± sd | min | max | n |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.metric} | {_num(r.mean)} ± {_num(r.sd)} | {_num(r.low)} | {_num(r.high)} | {r.n} |"
              for r in rows]
    return "\n".join([*head, "", *lines]) + "\n"


def csv(rows: Sequence[Row]) -> str:
    lines = ["metric,n,mean,sd,min,max"]
    lines += [f"{r.metric},{r.n},{r.mean:.6g},{r.sd:.6g},{r.low:.6g},{r.high:.6g}" for r in rows]
    return "\n".join(lines) + "\n"


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
    """One row per replicate with the few numbers ``dvc exp show`` cannot fit in a terminal: per model
    (flat, hier, informed) the test score, log loss (or lpd), LOO elpd and groups not converged, the sampling
    seconds of every fit in the timings files summed, and the params in which the rows differ (``key=value``).
    Rows of different likelihoods (classifiers and regressions) each keep their own scores: every score that
    some row has gets a column."""
    columns: list[tuple[str, str]] = []  # (column label, "file:key" of its metric)
    for model in MODELS:
        for choices in SCORES:
            for label, key in choices:
                name = f"metrics/{model}.json:{key}"
                if any(name in r.metrics for r in reps):
                    columns.append((f"{model}:{label}", name))
    varied = differing_params(reps)
    header = ["experiment", *[label for label, _ in columns], "sampling_s", "params that differ"]
    rows = []
    for i, r in enumerate(reps):
        seconds = [v for k, v in r.metrics.items() if k.startswith("timings/") and k.endswith("sampling.seconds")]
        changed = " ".join(f"{k.removeprefix('params.yaml:')}={json.dumps(vals[i], separators=(',', ':'))}"
                           for k, vals in varied.items())
        rows.append([r.name, *[_cell(r.metrics.get(name)) for _, name in columns],
                     _cell(round(sum(seconds), 1)) if seconds else "-", changed or "-"])
    return header, rows


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table as text: numbers right-aligned, two spaces apart; a ``model:label`` header is split over two
    lines (the model once, above its columns) so that the three models' columns stay narrow."""
    tops, labels = [], []
    for name in header:
        top, _, label = name.rpartition(":")
        tops.append(top if top not in tops else "")
        labels.append(label)
    table = [tops, labels, *map(list, rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    last = len(header) - 1

    def line(row: list[str], left: bool = False) -> str:
        cells = [c.ljust(w) if left or i in (0, last) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(cells).rstrip()

    lines = [line(tops, left=True)] if any(tops) else []
    return "\n".join([*lines, *(line(row) for row in table[1:])]) + "\n"


def headline_csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    import csv as csv_module
    import io

    out = io.StringIO()
    csv_module.writer(out, lineterminator="\n").writerows([header, *rows])
    return out.getvalue()
