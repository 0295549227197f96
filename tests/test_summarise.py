"""``hbnn summarise``: replicates from `dvc exp show --json`, their mean and sd, and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from hbnn import summarise


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
