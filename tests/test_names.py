"""Names that are not plain text (issue 45): refused where they are read, escaped where they are written.

Group names come from the table (and ``hbnn predict``'s input table), column names from the params. A name must be
printable text, not empty and at most :data:`hbnn.names.MAX_NAME_LENGTH` characters; anything else ends in one
``error:`` line naming the column and the row (or the key). A usable name that holds Markdown, HTML or mathtext
(``$``) goes through make_data, the fits and the report, and is shown as written in report.md, report.html and the
figures.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.text
import numpy as np
import pandas as pd
import pytest
import test_bad_inputs
import yaml
from conftest import TINY
from test_bad_inputs import _assert_one_error, _run, _set, _sites, _table_params
from test_report import RAW, write_fits

from hbnn import cli
from hbnn.config_read import load_params
from hbnn.data import tables
from hbnn.names import MAX_NAME_LENGTH
from hbnn.pipeline.runner import run_stage
from hbnn.pipeline.stages import load_run_tasks
from hbnn.pipeline.stages.make_data import make_data
from hbnn.report import metric_plots, plots
from hbnn.report.document import (
    Figure,
    FigureLinks,
    Heading,
    Para,
    Section,
    Table,
    markdown_text,
    render_html,
    render_markdown,
)
from hbnn.report.stage import report

# tests/test_bad_inputs.py's fixtures: a workspace with earlier outputs of every kind, and hbnn predict's inputs
workspace = test_bad_inputs.workspace
scored_inputs = test_bad_inputs.scored_inputs

# name in the table: what the one error line says about it (row 4 of the data holds it)
BAD_GROUPS = {
    "nul": ("S01\x00b", r"'S01\x00b' in row 4: the name holds the non-printable character U+0000"),
    "tab": ("S\t01", r"'S\t01' in row 4: the name holds the non-printable character U+0009"),
    "newline": ("S\n01", r"'S\n01' in row 4: the name holds the non-printable character U+000A"),
    "escape sequence": ("\x1b[31mS01", "U+001B"),
    "over-long": ("s" * (MAX_NAME_LENGTH + 1), f"in row 4: the name is {MAX_NAME_LENGTH + 1} characters long; names "
                                               f"may have at most {MAX_NAME_LENGTH}"),
    "only spaces": ("   ", "in row 4: the name is only spaces"),
}


@pytest.mark.parametrize("stage", ["check_params", "make_data"])
@pytest.mark.parametrize("case", sorted(BAD_GROUPS))
def test_a_group_name_that_is_not_printable_text_is_one_error_naming_column_and_row(workspace, capsys, tmp_path,
                                                                                     case, stage):
    """A NUL merged two groups in data/tasks.nc (netCDF cuts strings at one); a newline or tab broke every table
    the name was written in."""
    name, expected = BAD_GROUPS[case]
    path = _sites(tmp_path, lambda df: _set(df, "site", 3, name))
    before = workspace()
    code, err = _run(stage, _table_params(path), capsys)
    _assert_one_error(code, err, f"table {path}: group column 'site' has a group name that cannot be used: ")
    _assert_one_error(code, err, expected)
    assert workspace() == before


def test_an_empty_group_name_is_refused(workspace, capsys, tmp_path):
    """An empty cell of a CSV is a missing value; a Parquet file can hold an empty string, which is no name."""
    pytest.importorskip("pyarrow")
    df = _set(pd.read_csv(_sites(tmp_path, None), dtype={"site": str}), "site", 6, "")
    path = tmp_path / "table.parquet"
    df.to_parquet(path)
    before = workspace()
    code, err = _run("make_data", _table_params(path), capsys)
    _assert_one_error(code, err, "group column 'site' has a group name that cannot be used: '' in row 7: the name "
                                 "is empty")
    assert workspace() == before


@pytest.mark.parametrize("data, expected", [
    ({"features": ["temperature", "pres\x00sure", "humidity"]},
     r"invalid parameter data.features[1]='pres\x00sure': not usable as a column name: the name holds the "
     "non-printable character U+0000"),
    ({"label": ""}, "invalid parameter data.label='': not usable as a column name: the name is empty"),
    ({"group": "si\nte"}, r"invalid parameter data.group='si\nte': not usable as a column name: the name holds the "
                          "non-printable character U+000A"),
    ({"split": "p" * 150}, "ppp': not usable as a column name: the name is 150 characters long; names may have at "
                           "most 100"),
    ({"features": [" ", "pressure"]}, "invalid parameter data.features[0]=' ': not usable as a column name: the name "
                                      "is only spaces"),
])
def test_a_column_name_that_is_not_printable_text_is_one_error_naming_the_key(workspace, capsys, tmp_path, data,
                                                                               expected):
    path = _sites(tmp_path, None)
    before = workspace()
    code, err = _run("check_params", _table_params(path, **data), capsys)
    _assert_one_error(code, err, expected)
    _assert_one_error(code, err, f"invalid parameter data.{next(iter(data))}")
    assert workspace() == before


def test_predict_refuses_a_group_name_that_is_not_printable_text(scored_inputs, capsys, tmp_path):
    """``hbnn predict`` reads its input table's groups as make_data reads a table's (hbnn.data.tables.group_column)."""
    table = pd.read_csv("new.csv")
    table.loc[2, "shop"] = "new\x00er"
    table.to_csv("new.csv", index=False)
    code = cli.main(["predict", "--trace", "t.nc", "--input", "new.csv", "--output", "scored.csv"])
    _assert_one_error(code, capsys.readouterr().err, r"group column 'shop' has a group name that cannot be used: "
                                                     r"'new\x00er' in row 3: the name holds the non-printable")
    assert not (tmp_path / "scored.csv").exists()


# ----------------------------------------------------------------------------- escaped where written
HOSTILE = ["$\\undefinedmacro$", "50$ and 60$", "<script>alert(1)</script>", "a|b", "**bold**"]
FEATURES = ["x$1", "x2"]  # a feature name with a dollar sign


def hostile_table(path: Path, rows: int = 10, seed: int = 0) -> None:
    """Groups named :data:`HOSTILE`, ``rows`` rows each, both classes in each group's training and test rows."""
    rng = np.random.default_rng(seed)
    n = rows * len(HOSTILE)
    pd.DataFrame({"group": np.repeat(HOSTILE, rows), FEATURES[0]: rng.normal(size=n), FEATURES[1]: rng.normal(size=n),
                  "y": np.tile(np.arange(rows) % 2, len(HOSTILE))}).to_csv(path, index=False)


def hostile_params(table: Path, raw: dict) -> dict:
    return {**raw, "data": {"source": "table", "path": str(table), "features": FEATURES, "label": "y",
                            "group": "group"}}


def _assert_shown_as_written(reports: Path) -> None:
    """report.md escapes each name (and renders it as written), report.html holds it HTML-escaped, neither as
    markup."""
    md = (reports / "report.md").read_text()
    page = (reports / "report.html").read_text()
    for name in HOSTILE + FEATURES[:1]:
        assert markdown_text(name) in md, name
        assert html.escape(name) in page, name
    for raw in ("<script>", "a|b", "**bold**", "$\\undefinedmacro$", "50$ and", "x$1"):
        assert raw not in md, raw
    assert "<script" not in page
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in rendered and "<strong>bold" not in rendered
    for name in HOSTILE:
        assert html.escape(name, quote=False) in rendered, name
    # the status table's rows keep their cells: each row as many as its header
    for table in rendered.split("<table>")[1:]:
        body = table.split("</table>")[0]
        head = len(re.findall(r"<th[ >]", body.split("</thead>")[0]))
        assert all(len(re.findall(r"<td[ >]", row)) == head for row in body.split("</thead>")[1].split("<tr>")[1:])


@pytest.fixture
def recorded_figure_texts(tmp_path, monkeypatch):
    """Every text of every figure the report renders, as ``[text, parse_math]`` lines of a file (the surfaces are
    drawn in worker processes, which inherit the recording)."""
    record = tmp_path / "texts.jsonl"
    original = plots.png_bytes

    def recording(fig, *args, **kwargs):
        data = original(fig, *args, **kwargs)  # drawn: the tick labels exist now
        texts = [[t.get_text(), t.get_parse_math()] for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
        with record.open("a") as f:
            f.write(json.dumps(texts) + "\n")
        return data

    monkeypatch.setattr(plots, "png_bytes", recording)
    return lambda: [t for line in record.read_text().splitlines() for t in json.loads(line)]


def test_names_with_markup_go_through_the_report_as_written(tmp_path, monkeypatch, recorded_figure_texts):
    """The table's groups through make_data (in-process) and synthetic fits (tests/test_report.py's) to the report:
    "$\\undefinedmacro$" stopped the report (mathtext), "50$ and 60$" was drawn as maths, and report.md wrote
    "<script>", "|" and "**" as they were."""
    monkeypatch.chdir(tmp_path)
    hostile_table(tmp_path / "names.csv")
    Path("params.yaml").write_text(yaml.safe_dump(hostile_params(tmp_path / "names.csv", RAW)))
    assert run_stage("make_data", ["out"], make_data, ["--out", "tasks.nc"]) == 0
    params = load_params(Path("params.yaml"))
    tasks = load_run_tasks(Path("tasks.nc"), params)
    assert tasks.group_names == HOSTILE and tasks.features == FEATURES
    paths, _ = write_fits(tmp_path, params, tasks, np.random.default_rng(0))
    report(params, Path("tasks.nc"), paths["flat"], paths["hierarchical"], paths["informed"], Path("prior.nc"),
           Path("metrics"), Path("reports"))
    _assert_shown_as_written(tmp_path / "reports")
    texts = recorded_figure_texts()
    drawn = {text for text, _ in texts}
    # panel titles and tick labels, each as plots.literal writes it (drawn as written: the test below); the feature
    # in axis labels ("x\$1 (standardised)") and the correlations' ticks ("x\$1->0")
    assert {plots.short(name, plots.TITLE_CHARS) for name in HOSTILE} <= drawn  # names past 24 characters cut
    assert not drawn & {name for name in HOSTILE if "$" in name}
    assert any(text.startswith(plots.literal(FEATURES[0])) for text in drawn)
    assert not any(FEATURES[0] in text for text in drawn)
    # matplotlib's own mathtext is left alone: the log axis of the ESS figure labels its ticks 10^k
    assert any(text.startswith("$\\mathdefault{10^") and parse_math for text, parse_math in texts)


@pytest.mark.slow  # about 3 minutes: every stage's model compiles, the report
def test_names_with_markup_go_through_every_stage_as_written(tmp_path):
    """The same table through every stage script, as DVC runs them (tests/test_stages.py's run_all): real fits,
    the transfer stages' refits (named "<group>/<size>") and the report."""
    from test_stages import run_all

    hostile_table(tmp_path / "names.csv", rows=12)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(hostile_params(tmp_path / "names.csv", TINY)))
    run_all(tmp_path, params)
    _assert_shown_as_written(tmp_path / "reports")
    held = json.loads((tmp_path / "metrics" / "detail" / "transfer_prior.json").read_text())
    assert set(held["heldout_groups"]) < set(HOSTILE)


def _drawn(text: str, parse_math: bool) -> bytes:
    fig = plt.figure(figsize=(3.0, 0.5))
    fig.text(0.01, 0.5, text, parse_math=parse_math)
    return plots.png_bytes(fig)


@pytest.mark.parametrize("name", [*HOSTILE, "a\\$b$", "$x$", "$"])
def test_figures_draw_a_dollar_as_a_dollar(name):
    """A name through plots.literal draws, with mathtext on, exactly as the name drawn with mathtext off; before,
    "$\\undefinedmacro$" raised ParseFatalException as the figure was saved, and "50$ and 60$" was maths."""
    assert _drawn(plots.literal(name), True) == _drawn(name, False)
    fig, _ = metric_plots.plot_per_group([name, "b"], {"flat": np.array([0.5, 0.9])}, title=name)
    assert plots.png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_escapes_every_text_and_html_every_field():
    name = "<b>x</b> | *y* _z_ `c` [l](u) #h $m$ &amp; ~s~ \\"
    blocks = [Heading(name), Para(name), Para(name, warn=True), Table([name, "v"], [[name, "1"]]),
              Figure("a.png", name), FigureLinks(name, ["b.png"], [name])]
    sections = [Section(name, name, blocks), Section("s2", "h", [])]
    md = render_markdown(name, [Para(name)], sections)
    page = render_html(name, [Para(name)], sections, {"a.png": plots.png_bytes(plots.plot_message("x")[0])})
    assert name not in md and "<b>x" not in md and "<b>x" not in page
    # title and h1, the intro, the contents, h2, how to read, h3, 2 paragraphs, 2 cells, alt, caption, link text
    # and label
    assert page.count(html.escape(name)) == 15
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md)
    for markup in ("<b>x", "<em>y", "<em>z", "<code>", "<s>", 'href="u"', "<h1>h", "<h2>h"):
        assert markup not in rendered, markup
    assert rendered.count(html.escape(name, quote=False)) >= 10
    # where a paragraph begins, a list or heading marker is text too
    for text in ("- a", "+ a", "= a", "12. a", "3) a", "    code"):
        out = markdown_it.MarkdownIt("commonmark").render(markdown_text(text, block=True))
        assert out == f"<p>{html.escape(text.strip(), quote=False)}</p>\n", text


# ----------------------------------------------------------------------------- loading stays linear
class _Counted(np.ndarray):
    """An array that counts the elements every NumPy operation on it reads (``groups == name``: all of them)."""

    read = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _Counted.read += sum(x.size for x in inputs if isinstance(x, _Counted))
        plain = [np.asarray(x) if isinstance(x, _Counted) else x for x in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        _Counted.read += self.size
        plain = [np.asarray(a) if isinstance(a, _Counted) else a for a in args]
        return func(*plain, **kwargs)


@pytest.mark.parametrize("check", ["split", "groups"])
def test_reading_a_table_reads_each_row_a_fixed_number_of_times_whatever_the_groups(check):
    """Structural, not timed: the per-group split and the group checks read the rows' group names a fixed number
    of times, not once per group (a mask ``groups == name`` per group made 10,000 groups of 4 rows take ~20 s)."""
    n_groups, rows = 500, 4
    names = np.repeat([f"g{i}" for i in range(n_groups)], rows)
    y = np.tile(np.arange(rows) % 2, n_groups)
    split = tables.stratified_split(names, y, 0.5, 1)
    _Counted.read = 0
    counted = names.view(_Counted)
    if check == "split":
        assert np.array_equal(tables.stratified_split(counted, y, 0.5, 1), split)
    else:
        tables._check_groups(counted, y, split, "bernoulli", "table")
    assert _Counted.read <= 4 * names.size, f"read {_Counted.read / names.size:.0f} times the rows"
