"""``hbnn summarise``: replicates from `dvc exp show --json`, their mean and sd, and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from hbnn.pipeline import summarise


def _rev(rev, name, acc, seed, extra=None):
    return {"rev": rev, "name": name, "error": None,
            "data": {"metrics": {"metrics/flat.json": {"data": {"test": {"accuracy": acc, "n": 900}, **(extra or {})}},
                                 "timings/flat.json": {"data": {"sampling": {"seconds": 12.5}}}},
                     "params": {"params.yaml": {"data": {"seed": seed, "model": {"hidden_layers": [5, 5]}}}}}}


EXP_SHOW = [  # the shape of DVC 3's `dvc exp show --json`
    _rev("workspace", None, 0.99, 31),
    {**_rev("a" * 40, "main", 0.80, 31),
     "experiments": [{"revs": [_rev("b" * 40, "exp-one", 0.84, 1, {"flags": {"g02": "reason"}})]},
                     {"revs": [_rev("c" * 40, "exp-two", 0.86, 2)]},
                     {"revs": [{"rev": "d" * 40, "name": "exp-failed", "error": {"msg": "failed"}, "data": {}}]},
                     # DVC lists a running experiment with its baseline's metrics files: not a replicate
                     {"name": "exp-running", "executor": {"state": "running"},
                      "revs": [_rev("e" * 40, "exp-running", 0.80, 3)]},
                     {"name": "exp-done", "executor": {"state": "success"}, "revs": [_rev("f" * 40, "exp-done", 0.82,
                                                                                          4)]}]},
]


def test_replicates_are_commits_and_experiments_with_metrics():
    reps, skipped = summarise.replicates(EXP_SHOW)
    assert [r.name for r in reps] == ["main", "exp-one", "exp-two", "exp-done"]
    assert skipped == ["exp-failed (no metrics)", "exp-running (running)"]
    assert [r.name for r in summarise.replicates(EXP_SHOW, workspace=True)[0]][0] == "workspace"
    assert summarise.differing_params(reps) == {"params.yaml:seed": [31, 1, 2, 4]}


def test_mean_and_sample_sd_per_metric():
    rows = {r.metric: r for r in summarise.summarise(summarise.replicates(EXP_SHOW)[0])}
    acc = rows["metrics/flat.json:test.accuracy"]
    values = [0.80, 0.84, 0.86, 0.82]
    assert acc.n == 4 and acc.mean == pytest.approx(sum(values) / 4)
    assert acc.sd == pytest.approx(math.sqrt(sum((v - acc.mean) ** 2 for v in values) / 3))
    assert (acc.low, acc.high) == (0.80, 0.86)
    assert "timings/flat.json:sampling.seconds" not in rows  # wall-clock times only when asked for
    assert not any("flags" in m for m in rows)  # text values are not numbers
    timed = summarise.summarise(summarise.replicates(EXP_SHOW)[0], ["timings/*"])
    assert [r.metric for r in timed] == ["timings/flat.json:sampling.seconds"] and math.isclose(timed[0].sd, 0)


def test_the_command_prints_a_table_and_refuses_other_json(tmp_path):
    path = tmp_path / "exps.json"
    path.write_text(json.dumps(EXP_SHOW))
    cmd = [sys.executable, "-m", "hbnn", "summarise"]
    out = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "4 replicates: main, exp-one, exp-two, exp-done" in out.stdout
    assert "left out (not finished or no metrics): exp-failed (no metrics), exp-running (running)" in out.stdout
    assert "`params.yaml:seed` = 31, 1, 2, 4" in out.stdout
    assert "| metrics/flat.json:test.accuracy | 0.83 ± 0.02582 | 0.8 | 0.86 | 4 |" in out.stdout
    piped = subprocess.run([*cmd, "--csv", "--metrics", "*accuracy"], input=json.dumps(EXP_SHOW), capture_output=True,
                           text=True)
    assert piped.stdout.splitlines() == ["metric,n,mean,sd,min,max",
                                         "metrics/flat.json:test.accuracy,4,0.83,0.0258199,0.8,0.86"]
    for bad, message in (("{}", "not the output of `dvc exp show --json`"), ("nope", "is not JSON"),
                         ("[]", "lists no commit or experiment with metrics")):
        proc = subprocess.run(cmd, input=bad, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    named = subprocess.run([*cmd, "--names", "exp-*", "--csv"], input=json.dumps(EXP_SHOW), capture_output=True,
                           text=True)
    assert named.stdout.splitlines()[1].startswith("metrics/flat.json:test.accuracy,3,")  # main left out
    proc = subprocess.run([*cmd, "--names", "nope*"], input=json.dumps(EXP_SHOW), capture_output=True, text=True)
    assert proc.returncode == 2 and "named ['nope*']" in proc.stderr
    proc = subprocess.run([*cmd, "--metrics", "nothing*"], input=json.dumps(EXP_SHOW), capture_output=True, text=True)
    assert proc.returncode == 2 and "no metric matches" in proc.stderr
    proc = subprocess.run([*cmd, str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def _models(rev, name, seed, n_groups, regression=False):
    """A revision with the three fit stages' headline metrics, and timings files declared as metrics too (which
    the headline leaves out: wall-clock seconds are no result)."""
    score = {"rmse": 0.5, "lpd": -1.25} if regression else {"accuracy": 0.9, "log_loss": 0.3}
    metrics = {f"metrics/{m}.json": {"data": {"test": score, "loo": {"elpd": -254.31 - i},
                                              "sampling": {"groups_not_converged": i}}}
               for i, m in enumerate(summarise.MODELS)}
    metrics["timings/hier.json"] = {"data": {"sampling": {"seconds": 200.04}}}
    metrics["timings/transfer.json"] = {"data": {"flat": {"sampling": {"seconds": 10.0}}}}
    return {"rev": rev, "name": name, "error": None,
            "data": {"metrics": metrics, "params": {"params.yaml": {"data": {"seed": seed, "n_groups": n_groups}}}}}


def test_headline_is_one_row_per_run_with_each_models_headline_numbers():
    runs = [_models("workspace", None, 31, 18), {**_models("a" * 40, "main", 31, 18), "experiments": [
        {"revs": [_models("b" * 40, "groups-30", 31, 30)]}]}]
    header, rows = summarise.headline(summarise.replicates(runs, workspace=True)[0])
    assert header == ["experiment", *[f"{m}:{k}" for m in summarise.MODELS for k in ("acc", "logloss", "elpd", "nc")],
                      "params that differ"]
    assert rows[0] == ["workspace", "0.9", "0.3", "-254.3", "0", "0.9", "0.3", "-255.3", "1",
                       "0.9", "0.3", "-256.3", "2", "n_groups=18"]
    assert [r[0] for r in rows] == ["workspace", "main", "groups-30"] and rows[2][-1] == "n_groups=30"
    text = summarise.aligned(header, rows)
    lines = text.splitlines()
    assert lines[0].split() == list(summarise.MODELS)  # each model named once, above its four columns
    assert lines[1].split()[:5] == ["experiment", "acc", "logloss", "elpd", "nc"]
    assert max(map(len, lines)) <= 160
    assert summarise.headline_csv(header, rows).splitlines()[1] == ",".join(rows[0])
    # regression: RMSE and lpd take the place of accuracy and log loss; a model without metrics has no columns
    reps = summarise.replicates([_models("c" * 40, "reg", 1, 18, regression=True)])[0]
    reps[0].metrics.pop("metrics/informed.json:loo.elpd")
    header, _ = summarise.headline(reps)
    assert header[1:5] == ["flat:rmse", "flat:lpd", "flat:elpd", "flat:nc"] and "informed:elpd" not in header


def test_headline_fits_160_columns_whatever_the_experiments_differ_in():
    """Experiments differing in data.*, model.* and sampler.* settings, classifiers beside regressions: the table
    is cut into blocks of whole models, the params that differ are listed under it, and no line passes 160."""
    runs = [_models("a" * 40, "main", 31, 18)]
    exps = []
    for i in range(6):
        rev = _models(f"{i}" * 40, f"table-experiment-{i}", 31 + i, 18 + i, regression=i % 2 == 1)
        rev["data"]["params"]["params.yaml"]["data"].update({
            "data": {"source": "table", "path": f"data/examples/some/long/path/table_{i}.parquet",
                     "features": [f"feature_with_a_long_name_{k}" for k in range(i + 3)], "label": "y",
                     "group": "site", "split": "", "standardize": True},
            "model": {"hidden_layers": [8] * (i + 1), "likelihood": "gaussian" if i % 2 else "bernoulli",
                      "bias": bool(i % 3), "noise_sd": 0.5 + i},
            "sampler": {"draws": 1000 + 100 * i, "tune": 300 + i, "target_accept": 0.9 + i / 100}})
        exps.append({"revs": [rev]})
    runs[0]["experiments"] = exps
    header, rows = summarise.headline(summarise.replicates(runs)[0])
    text = summarise.aligned(header, rows)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 160, max(lines, key=len)
    assert len(rows[1][-1]) > 160  # the params alone would have run past the width
    legend = text.split("params that differ:\n")[1]
    assert [line.split()[0] for line in legend.splitlines() if not line.startswith("      ")] == \
        [f"{r[0]}:" for r in rows]
    assert "model.likelihood=\"gaussian\"" in legend.replace("\n      ", " ")
    narrow = summarise.aligned(header, rows, width=80)  # narrower than the three models' columns: blocks
    assert max(map(len, narrow.splitlines())) <= 80
    blocks = narrow.split("params that differ:\n")[0].strip("\n").split("\n\n")
    assert len(blocks) == 3
    for block, model in zip(blocks, summarise.MODELS, strict=True):  # whole models, the experiments in each
        lines = block.splitlines()
        assert lines[0].split() == [model] and [line.split()[0] for line in lines[2:]] == [r[0] for r in rows]


def test_headline_keeps_each_rows_own_scores_when_likelihoods_are_mixed():
    """A classifier and a regression experiment side by side: each row shows its own scores (before, the
    regression's RMSE and lpd had no column and the row showed '-' under acc and logloss)."""
    runs = [{**_models("a" * 40, "main", 31, 18), "experiments": [
        {"revs": [_models("b" * 40, "gauss", 31, 18, regression=True)]}]}]
    header, rows = summarise.headline(summarise.replicates(runs)[0])
    assert header[1:7] == ["flat:acc", "flat:rmse", "flat:logloss", "flat:lpd", "flat:elpd", "flat:nc"]
    by_name = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert by_name["main"]["flat:acc"] == "0.9" and by_name["main"]["flat:rmse"] == "-"
    assert by_name["gauss"]["flat:rmse"] == "0.5" and by_name["gauss"]["flat:lpd"] == "-1.25"
    assert by_name["gauss"]["flat:acc"] == "-"


def test_the_headline_command_reads_dvc_exp_show_json():
    cmd = [sys.executable, "-m", "hbnn", "headline"]
    runs = json.dumps([_models("a" * 40, "main", 31, 18)])
    out = subprocess.run(cmd, input=runs, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2].split()[:2] == ["main", "0.9"]
    out = subprocess.run([*cmd, "--csv"], input=runs, capture_output=True, text=True)
    assert out.stdout.splitlines()[0].startswith("experiment,flat:acc,flat:logloss")
    out = subprocess.run(cmd, input=json.dumps(EXP_SHOW), capture_output=True, text=True)  # queued, failed: said
    table = out.stdout.split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in table[2:]] == ["workspace", "main", "exp-one", "exp-two", "exp-done"]
    assert out.stderr == "left out (not finished or no metrics): exp-failed (no metrics), exp-running (running)\n"
    proc = subprocess.run(cmd, input="{}", capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
