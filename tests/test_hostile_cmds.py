"""Hostile inputs to the small commands and to `hbnn predict`'s sizes (issue 45).

Every bad input ends in exactly one ``error:`` line naming what is wrong, exit status 2, no traceback, and
every file that was there before byte-identical: ``hbnn summarise`` and ``hbnn headline`` on JSON of any shape,
``hbnn predict --output`` naming a file that is not a table of its format, ``HBNN_DASK_SCHEDULER`` of an
unsupported form, the report's metrics files of another shape, and `hbnn predict` on more rows than memory holds
at once (scored in chunks, with the same bytes out).
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY
from test_predict import NEW, write_trace
from test_summarise import EXP_SHOW, _models

from hbnn import cli
from hbnn.errors import InputError
from hbnn.model import likelihoods
from hbnn.model.forward import BLOCK
from hbnn.pipeline import chunking, predict
from hbnn.pipeline.runner import run_stage
from hbnn.report import inputs
from hbnn.sampling import cluster


def _one_error(code: int, err: str, expected: str) -> None:
    """Exit status 2 and one ``error:`` line holding ``expected`` (log lines, timestamped, aside)."""
    lines = [line for line in err.splitlines() if not line[:4].isdigit()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------- A: hbnn summarise / headline
# Markers that json.dumps cannot write, put into the text after it: nesting past json's recursion, past
# summarise.MAX_DEPTH, near both, and float literals past the float range
MARKERS = {"@DEEP@": "[" * 5000 + "]" * 5000, "@PASTMAX@": '{"a": ' * 150 + "1" + "}" * 150,
           "@NEARLIMIT@": "[" * 900 + "]" * 900, "@BIGFLOAT@": "1e400", "@NEGBIGFLOAT@": "-1e400"}
VALUES = [None, True, False, 0, -1, 1.5, "x", "0.8", "", [], {}, [None], {"data": None}, {"data": 5},
          float("nan"), float("inf"), float("-inf"), 10**400, -(10**400), 1.7e308, -1.7e308, 5e-324, 2**64,
          "a|b\nc,\"d\"", *MARKERS]
KEYS = ["name", "rev", "data", "metrics", "params", "experiments", "revs", "executor", "state", "error", "x|y"]
# a realistic document: DVC 3's shape with failed and running experiments, three models' headline metrics, a
# regression beside a classifier
BASE = [*EXP_SHOW, {**_models("9" * 40, "main2", 31, 18),
                    "experiments": [{"revs": [_models("8" * 40, "reg", 1, 18, regression=True)]}]}]


def _paths(node, at=()):
    yield at
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        yield from _paths(value, (*at, key))


def _mutate(doc, rng: random.Random):
    """One seeded change somewhere in ``doc``: a value replaced, a key or item deleted, a value wrapped in a list,
    a container turned into the other kind, or a key or item added."""
    at = rng.choice(list(_paths(doc)))
    kind, value = rng.randrange(6), rng.choice(VALUES)
    if not at:
        return value if kind == 0 else doc
    parent, key = doc, at[-1]
    for k in at[:-1]:
        parent = parent[k]
    old = parent[key]
    if kind <= 1:
        parent[key] = value
    elif kind == 2:
        del parent[key]
    elif kind == 3:
        parent[key] = [old]
    elif kind == 4:
        parent[key] = (list(old.values()) if isinstance(old, dict) else
                       {str(i): v for i, v in enumerate(old)} if isinstance(old, list) else {"data": old})
    elif isinstance(old, dict):
        old[rng.choice(KEYS)] = value
    elif isinstance(old, list):
        old.insert(rng.randrange(len(old) + 1), value)
    else:
        parent[key] = value
    return doc


def _text(doc) -> str:
    text = json.dumps(doc)  # NaN and Infinity as their JavaScript literals, as Python's json writes them
    for marker, raw in MARKERS.items():
        text = text.replace(json.dumps(marker), raw)
    return text


def _check_summary_csv(out: str) -> None:
    """Every row of ``hbnn summarise --csv``: six fields, and mean, min and max consistent with one another."""
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["metric", "n", "mean", "sd", "min", "max"]
    for row in rows[1:]:
        assert len(row) == 6, row
        n, (mean, sd, low, high) = int(row[1]), map(float, row[2:])
        assert n >= 1
        if math.isnan(low) or math.isnan(high):  # a NaN value: all four NaN
            assert math.isnan(low) and math.isnan(high) and math.isnan(mean) and math.isnan(sd), row
        elif math.isnan(mean):  # only where both infinities are among the values
            assert low == -math.inf and high == math.inf, row
        else:
            assert low <= high and (low <= mean <= high or math.isclose(mean, low) or math.isclose(mean, high)), row


def test_fuzzed_exp_show_ends_in_a_table_or_one_error_line(tmp_path, capsys):
    """300 seeded mutations of a realistic `dvc exp show --json` document through both commands, in-process:
    each ends in exit 0 with a table, or exit 2 with one error line; no exception escapes."""
    rng = random.Random(45)
    path = tmp_path / "exps.json"
    outcomes = {0: 0, 2: 0}
    for i in range(300):
        doc = json.loads(json.dumps(BASE))
        for _ in range(rng.randint(1, 3)):
            doc = _mutate(doc, rng)
        path.write_text(_text(doc))
        runs = (["summarise", str(path), *rng.choice([[], ["--csv"], ["--workspace"], ["--metrics", "*"],
                                                     ["--csv", "--metrics", "*"]])],
                ["headline", str(path), *rng.choice([[], ["--csv"]])])
        for argv in runs:
            try:
                code = cli.main(argv)
            except BaseException as err:  # noqa: BLE001 - the point: nothing may escape
                pytest.fail(f"mutation {i}, {argv[0]}: {type(err).__name__}: {err}")
            out, err = capsys.readouterr()
            assert code in outcomes, (i, argv, err)
            outcomes[code] += 1
            lines = err.splitlines()
            if code == 2:
                assert len(lines) == 1 and lines[0].startswith("error: ") and not out, (i, argv, err)
                continue
            assert out and all(line.startswith("left out (not finished") for line in lines), (i, argv, err)
            if argv[0] == "summarise" and "--csv" in argv:
                _check_summary_csv(out)
    assert min(outcomes.values()) > 50, outcomes  # both ends are exercised


def _exp_show(*accuracies, key="accuracy") -> str:
    """EXP_SHOW with the four replicates' test accuracy (main, exp-one, exp-two, exp-done) set to ``accuracies``
    (the literal JSON text of each)."""
    doc = json.loads(json.dumps(EXP_SHOW))
    revs = [doc[1], *(e["revs"][0] for i, e in enumerate(doc[1]["experiments"]) if i in (0, 1, 4))]
    for rev, value in zip(revs, accuracies, strict=True):
        rev["data"]["metrics"]["metrics/flat.json"]["data"]["test"][key] = f"@{value}@"
    text = json.dumps(doc)
    for value in accuracies:
        text = text.replace(f'"@{value}@"', value)
    return text


@pytest.mark.parametrize("values", [("NaN", "0.8", "0.9", "0.85"), ("0.8", "0.9", "0.85", "NaN")])
def test_a_nan_metric_makes_mean_sd_min_and_max_nan_wherever_it_stands(tmp_path, capsys, values):
    """Python's min and max of a list holding NaN depend on where it stands (min([nan, 1]) is nan, min([1, nan])
    is 1): a NaN metric showed nan as mean but 1 as min and max."""
    (tmp_path / "e.json").write_text(_exp_show(*values))
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--csv", "--metrics", "*accuracy"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "metrics/flat.json:test.accuracy,4,nan,nan,nan,nan"
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--metrics", "*accuracy"]) == 0
    out = capsys.readouterr().out
    assert "| metrics/flat.json:test.accuracy | nan ± nan | nan | nan | 4 |" in out
    named = "main" if values[0] == "NaN" else "exp-done"
    assert f"- non-finite values (a NaN makes its metric's mean, sd, min and max nan): " \
           f"`metrics/flat.json:test.accuracy`: {named}=nan" in out


def test_infinities_are_ordered_values_and_huge_numbers_do_not_overflow(tmp_path, capsys):
    (tmp_path / "e.json").write_text(_exp_show("1e400", "0.5", "1.5", "1"))  # 1e400: read as infinity
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--csv", "--metrics", "*accuracy"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "metrics/flat.json:test.accuracy,4,inf,nan,0.5,inf"
    (tmp_path / "e.json").write_text(_exp_show("1e400", "-1e400", "1", "1"))
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--csv", "--metrics", "*accuracy"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "metrics/flat.json:test.accuracy,4,nan,nan,-inf,inf"
    # near the float limit: (v - mean) ** 2 raised OverflowError; scaled, mean and sd are exact
    (tmp_path / "e.json").write_text(_exp_show("1.7e308", "-1.7e308", "1.7e308", "-1.7e308"))
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--csv", "--metrics", "*accuracy"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split(",")
    assert float(row[2]) == 0 and float(row[3]) == pytest.approx(1.7e308 * math.sqrt(4 / 3))
    assert cli.main(["headline", str(tmp_path / "e.json")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(("text", "expected"), [
    (_exp_show("1" + "0" * 400, "0.5", "0.5", "0.5"),
     "[1] (main): metric metrics/flat.json:test.accuracy is an integer of 401 digits, too large for a float"),
    ("[" * 5000 + "]" * 5000, "nests more than 100 levels deep"),
    (json.dumps([{"rev": "workspace", "data": {"params": {"p": {"data": {"a": 1}}}}}]).replace(
        '"a": 1', '"a": ' + "[" * 150 + "]" * 150), "nests more than 100 levels deep"),
    (json.dumps([{**EXP_SHOW[1], "experiments": {"revs": []}}]),
     "[0].experiments is an object, expected a list"),
    (json.dumps([{**EXP_SHOW[1], "experiments": [{"revs": [{"rev": 5, "data": {}}]}]}]),
     "[0].experiments[0].revs[0].rev is a number, expected a string"),
    (json.dumps([{**EXP_SHOW[1], "data": {"metrics": {"metrics/flat.json": [1]}}}]),
     "[0].data.metrics[\"metrics/flat.json\"] is a list, expected an object"),
    (json.dumps([{**EXP_SHOW[1], "experiments": [{"executor": {"state": 3}, "revs": []}]}]),
     "[0].experiments[0].executor.state is a number, expected a string"),
    ("[null]", "revision [0] is null, not an object"),
    ("NaN", "expected a JSON list of revisions, found a number"),
])
def test_json_of_another_shape_is_one_error_naming_where(tmp_path, capsys, text, expected):
    (tmp_path / "e.json").write_text(text)
    for command in ("summarise", "headline"):
        _one_error(cli.main([command, str(tmp_path / "e.json")]), capsys.readouterr().err, expected)


def test_names_and_keys_with_separators_keep_the_tables_whole(tmp_path, capsys):
    doc = json.loads(json.dumps(EXP_SHOW))
    data = doc[1]["data"]["metrics"]["metrics/flat.json"]["data"]
    data['odd,key|"x"\nnext'] = 0.5
    doc[1]["name"] = "main|\nbranch"
    (tmp_path / "e.json").write_text(json.dumps(doc))
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--csv", "--metrics", "*odd*"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows == [["metric", "n", "mean", "sd", "min", "max"],
                    ['metrics/flat.json:odd,key|"x"\nnext', "1", "0.5", "nan", "0.5", "0.5"]]
    assert cli.main(["summarise", str(tmp_path / "e.json"), "--metrics", "*odd*"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| metrics/")]
    assert table == ['| metrics/flat.json:odd,key\\|"x" next | 0.5 ± n/a | 0.5 | 0.5 | 1 |']
    assert cli.main(["headline", str(tmp_path / "e.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("main| branch ") for line in lines)


# ----------------------------------------------------------------------------- B: hbnn predict --output
@pytest.fixture
def scored(tmp_path, monkeypatch):
    """A directory with a hierarchical trace (t.nc), another trace (traces/flat.nc) and rows to score (new.csv)."""
    monkeypatch.chdir(tmp_path)
    write_trace(tmp_path / "t.nc", "hierarchical")
    (tmp_path / "traces").mkdir()
    write_trace(tmp_path / "traces" / "flat.nc", "flat")
    NEW.to_csv(tmp_path / "new.csv", index=False)
    return tmp_path


def _predict(output: str) -> int:
    return cli.main(["predict", "--trace", "t.nc", "--input", "new.csv", "--output", output])


@pytest.mark.parametrize(("make", "output", "expected"), [
    (None, "traces/flat.nc", "--output traces/flat.nc must end in .csv, or .parquet or .pq"),
    (None, "scored.txt", "--output scored.txt must end in .csv"),
    (None, "scored", "--output scored must end in .csv"),
    (lambda d: (d / "traces/flat.nc").rename(d / "flat.csv"), "flat.csv",
     "--output flat.csv exists and is an HDF5 or NetCDF-4 file (a trace?), not a CSV table"),
    (lambda d: (d / "classic.csv").write_bytes(b"CDF\x01\x00\x00\x00\x00"), "classic.csv",
     "exists and is a NetCDF file (a trace?), not a CSV table"),
    (lambda d: NEW.to_parquet(d / "p.csv"), "p.csv", "exists and is a Parquet file, not a CSV table"),
    (lambda d: (d / "b.csv").write_bytes(b"a,b\n\x00\x01"), "b.csv", "exists and is a binary file"),
    (lambda d: (d / "l.csv").write_bytes("caf\u00e9,1\n".encode("latin-1")), "l.csv", "is not UTF-8 text"),
    (lambda d: (d / "s.parquet").write_text("shop,a\n"), "s.parquet", "exists and is a text file, not a Parquet"),
    (lambda d: (d / "t.pq").write_bytes((d / "t.nc").read_bytes()), "t.pq",
     "exists and is an HDF5 or NetCDF-4 file (a trace?), not a Parquet table"),
])
def test_predict_refuses_an_output_that_is_not_a_table_of_its_format(scored, capsys, make, output, expected):
    if make is not None:
        make(scored)
    before = _files(scored)
    _one_error(_predict(output), capsys.readouterr().err, expected)
    assert _files(scored) == before  # nothing written, nothing replaced, no temporary left


def test_predict_replaces_an_earlier_table_of_its_format(scored, capsys):
    (scored / "out.csv").write_text("shop,a\nold,1\n")
    (scored / "empty.csv").write_bytes(b"")
    assert _predict("out.csv") == 0 and _predict("empty.csv") == 0
    assert _predict("out.parquet") == 0 and _predict("out.parquet") == 0  # a Parquet file replaced by Parquet
    assert (scored / "out.csv").read_bytes() == (scored / "empty.csv").read_bytes()
    assert (scored / "out.csv").read_text().startswith("shop,a,b,note,mean")
    pd.testing.assert_frame_equal(pd.read_parquet(scored / "out.parquet"), pd.read_csv(scored / "out.csv"),
                                  check_exact=False, rtol=1e-12)


# ----------------------------------------------------------------------------- C: HBNN_DASK_SCHEDULER
@pytest.mark.parametrize(("value", "expected"), [
    ("ucx://127.0.0.1:13337", "HBNN_DASK_SCHEDULER='ucx://127.0.0.1:13337': ucx:// needs UCX's transport"),
    ("inproc://10.0.0.1/1/2", "inproc:// is a scheduler inside one process"),
    ("http://host:80", "http:// is not a Dask transport"),
    ("tcp://host", "HBNN_DASK_SCHEDULER='tcp://host': 'host' is not host:port"),
    ("tcp://", "'' is not host:port"),
    ("tcp://host:0", "port 0 is not in 1-65535"),
    ("tcp://host:99999", "port 99999 is not in 1-65535"),
    ("tcp://a host:1", "'a host:1' is not host:port"),
    ("local:0", "HBNN_DASK_SCHEDULER='local:0': expected local, local:N with N >= 1"),
    ("LOCAL", "HBNN_DASK_SCHEDULER='LOCAL': 'LOCAL' is not host:port"),
    ("local:99999", "HBNN_DASK_SCHEDULER='local:99999': 99999 worker processes on this machine's"),
])
def test_an_unsupported_scheduler_is_named(value, expected):
    with pytest.raises(InputError) as err:
        cluster.check_scheduler(value)
    assert expected in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["", "local", "local:3", "tcp://10.0.0.1:8786", "tls://sched.example.org:8786",
                                   "ws://h:1", "wss://h:65535", "tcp://[::1]:8786", "host-1:8786"])
def test_the_supported_schedulers_pass(value):
    cluster.check_scheduler(value)


@pytest.fixture
def tasks_dir(tmp_path, monkeypatch):
    """A directory with TINY's params.yaml and tasks file (data/tasks.nc)."""
    from hbnn.pipeline.stages.make_data import make_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY, sort_keys=False))
    assert run_stage("make_data", ["out"], make_data, ["--out", "data/tasks.nc"]) == 0
    return tmp_path


def test_a_stage_refuses_an_unsupported_scheduler_before_sampling(tasks_dir, capsys, monkeypatch):
    """``ucx://`` gave a TypeError from deep inside Dask (its UCX connector is abstract without distributed-ucxx),
    after the stage had built its model."""
    from hbnn.pipeline.stages.fit_flat import fit_flat

    def no_sampling(*args, **kwargs):
        raise AssertionError("sampled")

    monkeypatch.setattr(cluster, "fit_shard", no_sampling)
    monkeypatch.setenv(cluster.SCHEDULER_ENV, "ucx://127.0.0.1:13337")
    (tasks_dir / "traces").mkdir()
    (tasks_dir / "traces" / "flat.nc").write_text("earlier")
    before = _files(tasks_dir)
    argv = ["--tasks-path", "data/tasks.nc", "--trace-out", "traces/flat.nc", "--metrics-out", "metrics/flat.json",
            "--timing-out", "timings/flat.json"]
    code = run_stage("fit_flat", ["tasks_path", "trace_out", "metrics_out", "timing_out"], fit_flat, argv)
    _one_error(code, capsys.readouterr().err, "HBNN_DASK_SCHEDULER='ucx://127.0.0.1:13337': ucx:// needs UCX's")
    assert _files(tasks_dir) == before


# ----------------------------------------------------------------------------- D: the report's metrics files
def _detail_files(d: Path, names, transfer: dict | None) -> None:
    """Detail metrics the report reads (the least it needs), with ``transfer`` as transfer.json."""
    (d / "metrics" / "detail").mkdir(parents=True)
    for stem in ("flat", "hier", "informed"):
        (d / "metrics" / "detail" / f"{stem}.json").write_text(json.dumps({"per_group": {g: {} for g in names}}))
    (d / "metrics" / "detail" / "prior.json").write_text("{}")
    if transfer is not None:
        (d / "metrics" / "detail" / "transfer.json").write_text(json.dumps(transfer))


def _transfer() -> dict:
    """A transfer.json as the transfer stage writes it (one size; a standard error of one row: null)."""
    test = {"accuracy": 0.8, "lpd_mean": -0.5, "n": 1}
    model = {"test": test, "lpd_se": None, "fits_not_converged": 0, "max_rhat": 1.0}
    return {"heldout_groups": ["g1"], "training_groups": ["g0", "g2"], "skipped": [], "stops_mattering": None,
            "sizes": {"n2": {"rows_mean": 2.0, "groups": 1, "difference": {"mean": 0.1, "se": None, "n": 1},
                             "flat": model, "informed": model}},
            "population": {"test": test, "lpd_se": None},
            "fits": {"flat": {"g1/n2": {"converged": True}}, "informed": {"g1/n2": {"converged": True}}},
            "sampling": {"flat": {"fits": 1, "fits_not_converged": 0}, "informed": {"fits": 1, "fits_not_converged": 0},
                         "hierarchical": {"max_rhat": 1.001, "min_ess_bulk": 500.0, "groups_not_converged": 0}}}


def _edit(path: str, value):
    """_transfer() with the dotted ``path`` set to ``value`` (deleted where ``value`` is ``...``)."""
    doc = _transfer()
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


NAMES = ["g0", "g1", "g2"]


def test_the_report_reads_the_transfer_file_the_stage_writes(tmp_path):
    """A standard error of one row is written as null (no NaN in JSON): the report computes with it as NaN."""
    _detail_files(tmp_path, NAMES, _transfer())
    metrics, prior, transfer = inputs.read_metrics(tmp_path / "metrics", NAMES, "accuracy")
    assert math.isnan(transfer["sizes"]["n2"]["difference"]["se"]) and transfer["stops_mattering"] is None
    assert metrics["hierarchical"] == {"per_group": {g: {} for g in NAMES}} and prior == {}
    _detail_files(tmp_path / "none", NAMES, None)
    assert inputs.read_metrics(tmp_path / "none" / "metrics", NAMES, "rmse")[2] is None


@pytest.mark.parametrize(("transfer", "expected"), [
    (_edit("population", ...), "population is missing"),
    (_edit("sizes.n2.flat.test", {"lpd_mean": -0.5}), "sizes.n2.flat.test.accuracy is missing"),
    (_edit("sizes.n2.difference.se", "0.1"), "sizes.n2.difference.se is a string, expected a finite number"),
    (_edit("sizes.n2.rows_mean", 10**400), "sizes.n2.rows_mean is a number, expected a finite number"),
    (_edit("sizes.n2.flat.fits_not_converged", 1.5), "fits_not_converged is a number, expected a whole number"),
    (_edit("sizes", {"two": _transfer()["sizes"]["n2"]}), "sizes has the key 'two', expected n<rows> or all"),
    (_edit("sizes", {"n" + "9" * 5000: _transfer()["sizes"]["n2"]}), "expected n<rows> or all"),
    (_edit("fits.flat", {"g1": {}}), "fits.flat has the key 'g1', expected <group>/<size>"),
    (_edit("heldout_groups", "g1"), "heldout_groups is a string, expected a list"),
    (_edit("training_groups", [1]), "training_groups[0] is a number, expected a string"),
    (_edit("sampling.hierarchical", {"max_rhat": 1.0}), "sampling.hierarchical.min_ess_bulk is missing"),
    (_edit("sampling.hierarchical.restarted", [{"why": "x"}]), "sampling.hierarchical.restarted[0].reason is missing"),
    ([1, 2], "the file is a list, expected an object"),
])
def test_a_transfer_file_of_another_shape_is_one_error_naming_file_and_key(tmp_path, transfer, expected):
    _detail_files(tmp_path, NAMES, transfer)
    with pytest.raises(InputError) as err:
        inputs.read_metrics(tmp_path / "metrics", NAMES, "accuracy")
    message = str(err.value)
    assert message.startswith(f"metrics file {tmp_path / 'metrics' / 'detail' / 'transfer.json'}: ")
    assert expected in message and "\n" not in message


@pytest.mark.parametrize(("file", "content", "expected"), [
    ("metrics/detail/flat.json", {"per_group": ["g0", "g1", "g2"]}, "per_group is a list, expected an object"),
    ("metrics/detail/hier.json", {"per_group": {g: {"ess_bulk_fn": float("nan")} for g in NAMES}},
     "per_group.g0.ess_bulk_fn is nan, expected a finite number or null"),
    ("metrics/detail/hier.json", {"per_group": {g: {} for g in NAMES}, "sampling": {"divergences": 1.5}},
     "sampling.divergences is a number, expected a whole number >= 0 or null"),
    ("metrics/detail/informed.json", {"per_group": {g: {"test": {"accuracy": "high"}} for g in NAMES}},
     "per_group.g0.test.accuracy is a string"),
    ("metrics/detail/prior.json", {"alignment": [1]}, "alignment is a list, expected an object"),
    ("metrics/detail/prior.json", {"layers": {"in": {"group_sd": {"mean": "x"}}}}, "layers.in.group_sd.mean"),
    ("metrics/detail/flat.json", {"per_group": {g: {} for g in NAMES}, "sampling": [1]},
     "sampling is a list, expected an object"),
    ("metrics/detail/flat.json", {"per_group": {g: {} for g in NAMES}, "sampling": {"max_rhat_fn": "1.0"}},
     "sampling.max_rhat_fn is a string"),
    ("metrics/detail/flat.json", "[" * 50_000 + "]" * 50_000, "its JSON nests too deeply"),  # past any recursion limit
])
def test_the_other_metrics_files_are_checked_too(tmp_path, file, content, expected):
    _detail_files(tmp_path, NAMES, _transfer())
    (tmp_path / file).write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InputError) as err:
        inputs.read_metrics(tmp_path / "metrics", NAMES, "accuracy")
    assert str(err.value).startswith(f"metrics file {tmp_path / file}")
    assert expected in str(err.value)


def test_the_report_stage_refuses_a_transfer_file_of_another_shape(tasks_dir, capsys):
    """It stopped with KeyError: 'population' after reading every metrics file."""
    from hbnn.data.tasks import load_tasks
    from hbnn.report.stage import report

    names = load_tasks(tasks_dir / "data" / "tasks.nc").group_names
    _detail_files(tasks_dir, names, _edit("population", ...))
    (tasks_dir / "reports").mkdir()
    (tasks_dir / "reports" / "report.md").write_text("earlier")
    before = _files(tasks_dir)
    paths = ["tasks_path", "flat_trace", "hier_trace", "informed_trace", "prior_path", "metrics_dir", "out_dir"]
    argv = ["--tasks-path", "data/tasks.nc", "--flat-trace", "traces/flat.nc", "--hier-trace", "traces/hier.nc",
            "--informed-trace", "traces/informed.nc", "--prior-path", "priors/informed.nc", "--metrics-dir",
            "metrics", "--out-dir", "reports"]
    code = run_stage("report", paths, report, argv)
    _one_error(code, capsys.readouterr().err, "metrics/detail/transfer.json: population is missing")
    assert _files(tasks_dir) == before


# ----------------------------------------------------------------------------- E: hbnn predict's sizes
SAMPLES = 60  # the test traces' chains x draws (test_predict.CHAINS, DRAWS)


def _rows(sizes: dict[str, int], seed: int = 0) -> pd.DataFrame:
    """Rows of the given groups, interleaved at random, with features spread around the training range."""
    rng = np.random.default_rng(seed)
    groups = np.array([g for g, n in sizes.items() for _ in range(n)], dtype=object)
    rng.shuffle(groups)
    return pd.DataFrame({"shop": groups, "a": rng.normal(10, 2, groups.size), "b": rng.normal(-1, 0.5, groups.size)})


def _smallest_budget(likelihood: str, n_weights: int = 2) -> int:
    """The least budget chunk_rows accepts for the test traces: the forward pass of one block, summaries 2 rows
    at a time (one piece of 3)."""
    value = 8 * SAMPLES
    arrays = likelihoods.get(likelihood).summary_arrays
    return value * n_weights * chunking.WEIGHT_COPIES + value * (BLOCK + 1) + arrays * value * 3


@pytest.mark.parametrize("likelihood", sorted(likelihoods.LIKELIHOODS))
def test_chunked_scores_are_byte_identical_to_scoring_each_group_at_once(tmp_path, likelihood):
    """Groups of 1, 2, 513 (a block and a row: never a chunk of one row) and 600 rows, two of them unseen,
    scored at once (the default budget holds every group) and in chunks of every kind: whole blocks, and one
    block's summaries a few rows at a time; every number is the same to the bit, so the CSV bytes are too."""
    write_trace(tmp_path / "t.nc", "hierarchical", likelihood=likelihood)
    table = _rows({"g1": 513, "g2": 1, "new": 600, "other": 2})
    table.loc[table["shop"] == "new", ["a", "b"]] = [11.0, -0.8]  # every unseen row alike: equal predictions
    at_once = predict.predict_table(tmp_path / "t.nc", table, "input", seed=3)
    exact = predict.score_columns(tmp_path / "t.nc", table, "input", seed=3)
    assert chunking.chunk_rows(SAMPLES, 2, likelihood, 600).rows >= 600  # the default: each group at once
    smallest = _smallest_budget(likelihood)
    value, arrays = 8 * SAMPLES, likelihoods.get(likelihood).summary_arrays
    for budget, rows, summary_rows in ((smallest, BLOCK, 2), (smallest + 5 * arrays * value, BLOCK, 7),
                                       (value * 8 + arrays * value * (BLOCK + 1), BLOCK, BLOCK)):
        plan = chunking.chunk_rows(SAMPLES, 2, likelihood, 600, budget)
        assert (plan.rows, plan.summary_rows) == (rows, summary_rows) and plan.peak <= budget
        chunked = predict.score_columns(tmp_path / "t.nc", table, "input", seed=3, budget=budget)
        assert all(np.array_equal(chunked[c], exact[c]) for c in predict.OUTPUT_COLUMNS), budget
    chunked = predict.predict_table(tmp_path / "t.nc", table, "input", seed=3, budget=smallest + 5 * arrays * value)
    assert chunked.to_csv(index=False) == at_once.to_csv(index=False)
    new = at_once[at_once["shop"] == "new"]
    assert new[["mean", "sd", "lower_94", "upper_94"]].nunique().eq(1).all()
    with pytest.raises(InputError, match=r"scoring with this trace needs about \d+ KiB at the least .* limit"):
        predict.predict_table(tmp_path / "t.nc", table, "input", seed=3, budget=smallest - 1)


def test_new_group_draws_are_drawn_once_not_per_chunk(tmp_path, monkeypatch):
    """Rows of an unseen group in different chunks use the same new-group networks: drawn once from --seed."""
    write_trace(tmp_path / "t.nc", "hierarchical", group_sd=2.0)
    table = _rows({"new": 3 * BLOCK})
    table.loc[:, ["a", "b"]] = [12.0, -1.5]
    calls = []
    real = predict.population_weights

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(predict, "population_weights", counted)
    out = predict.predict_table(tmp_path / "t.nc", table, "input", seed=7, budget=_smallest_budget("bernoulli"))
    assert len(calls) == 1
    assert out[["mean", "sd", "lower_94", "upper_94"]].nunique().eq(1).all()  # one set of draws for every chunk
    other = predict.predict_table(tmp_path / "t.nc", table.iloc[:2], "input", seed=7)
    assert out.loc[0, "mean"] == other.loc[0, "mean"]


def test_scoring_memory_does_not_grow_with_the_draws_times_rows(tmp_path):
    """Twice the rows add only the rows' own columns (a few hundred bytes each), not rows x draws: unchunked,
    20,000 more rows of 600 draws would add ~190 MB of (draw, row) arrays."""
    write_trace(tmp_path / "t.nc", "hierarchical")
    fitted = predict.load_fitted(tmp_path / "t.nc")
    post = fitted.posterior
    many = post.isel(draw=np.arange(post.sizes["draw"]).repeat(10))  # 600 draws
    fitted = predict.Fitted(many.assign_coords(draw=np.arange(many.sizes["draw"])), fitted.constant_data)
    budget = 4 * 2**20

    def peak(n: int) -> int:
        table = _rows({"g1": n // 2, "new": n // 2})
        tracemalloc.start()
        predict.predict_table(fitted, table, "input", budget=budget)
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return top

    small, large = peak(20_000), peak(40_000)
    assert small < budget + 20_000 * 400
    assert large - small < 20_000 * 400


def test_the_cli_refuses_a_trace_too_large_to_score_in_one_line(scored, capsys, monkeypatch):
    monkeypatch.setattr(chunking, "SCORING_BUDGET", 2**10)
    big = _rows({"g1": 600})
    big.to_csv(scored / "big.csv", index=False)
    before = _files(scored)
    code = cli.main(["predict", "--trace", "t.nc", "--input", "big.csv", "--output", "scored.csv"])
    _one_error(code, capsys.readouterr().err, "over the limit of 1 KiB; score with a trace that keeps fewer draws")
    assert _files(scored) == before


def test_the_default_traces_are_scored_in_large_chunks():
    """The default hierarchical trace (2 chains, up to 10,000 draws; 40 weights): 333 rows or more at a time."""
    for samples, rows in ((5000, (2048, 2048)), (10_000, (1024, 1024)), (20_000, (512, 333))):
        plan = chunking.chunk_rows(samples, 40, "bernoulli", 10**6)
        assert (plan.rows, plan.summary_rows) == rows and plan.peak <= chunking.SCORING_BUDGET
    assert chunking.chunk_rows(40_000, 40, "poisson", 10**6).summary_rows >= 2
    with pytest.raises(InputError, match="over the limit of 256 MiB"):
        chunking.chunk_rows(60_000, 40, "bernoulli", 10**6)
    assert chunking.chunk_rows(60_000, 40, "bernoulli", 2).rows == BLOCK  # two rows to score: they fit


def test_headline_refuses_an_endless_input_before_it_fills_the_memory(tmp_path, capsys, monkeypatch):
    """`hbnn headline /dev/zero` read the endless file whole (3.8 GB before a memory limit stopped it)."""
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text("[" + " " * 2000 + "]")
    assert cli.main(["headline", str(big)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "big.json holds more than 0 MiB" in err
    assert cli.main(["headline", "/dev/zero"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds more than" in err


def test_the_plots_data_hold_names_that_cannot_end_the_plots_pages_scripts():
    """DVC's plots page embeds the data as JSON inside a <script> without escaping it."""
    import numpy as np

    from hbnn.report.outputs import per_group_csv

    name = "</script><script>alert(1)</script><!--"
    text = per_group_csv({m: np.array([0.5]) for m in ("flat", "hierarchical", "informed")}, [name])
    assert "</" not in text and "<!--" not in text and "<\\/script><script>alert(1)<\\/script><\\!--" in text
