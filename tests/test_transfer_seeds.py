"""The transfer experiment over data seeds: benchmarks/transfer_seeds.py's summary, table and file, and the report's
part on it (hbnn.report.seeds_study): shown for the params it measured, one line otherwise, a malformed file refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from hbnn.config import Params
from hbnn.errors import InputError
from hbnn.report.document import Heading, Para, Section, Table, render_html, render_markdown
from hbnn.report.seeds_study import read_study, seeds_blocks, seeds_reading, study_hash, study_keys

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is a package at the repository root

from benchmarks import transfer_seeds  # noqa: E402

PARAMS = Params()


def _row(seed: int, flat: dict[str, float], refit: dict[str, float], missed: int = 0) -> dict:
    """A seed's row as per_seed_row makes it: informed - flat and informed - refit per size."""
    sizes = {label: {"informed - flat": flat[label], "informed - refit": refit[label],
                     "refit - flat": round(flat[label] - refit[label], 6)} for label in flat}
    return {"seed": seed, "seconds": {"transfer": 1.0}, "sizes": sizes,
            "not_converged": {"flat": 0, "informed": 0, "hier_refit": missed, "hierarchical": 0}}


def _rows(shift: float) -> list[dict]:
    """Three seeds: at n2 informed - flat is 0.1 + shift +- 0.01, at all 0.0 +- 0.1; informed - refit -0.05 +- 0.01."""
    return [_row(s, {"n2": 0.1 + shift + d, "all": 10 * d}, {"n2": -0.05 + d, "all": -0.05 + d}, missed=int(s == 2))
            for s, d in ((31, -0.01), (1, 0.0), (2, 0.01))]


def _study(params: Params = PARAMS, complete: bool = True) -> dict:
    """A study file's content, as the script writes it (strict JSON, keys sorted), over both prior methods."""
    rows = {"mvnormal": _rows(0.0), "plugin": _rows(0.2)}
    result = {"measured_utc": "2026-01-01T00:00:00+00:00", "commit": "0123456789abcdef", "params": "params.yaml",
              "overrides": {}, "params_hash": study_hash(params), "varied": ["seed", "prior.method"],
              "seeds_requested": [31, 1, 2], "complete": complete, "wall_s": 1.0,
              "methods": {m: {"seeds": r, "summary": transfer_seeds.summary(r)} for m, r in rows.items()}}
    return json.loads(json.dumps(transfer_seeds.strict(result), sort_keys=True, allow_nan=False))


def _texts(blocks) -> str:
    return "\n".join(b.text if isinstance(b, Para | Heading) else json.dumps([b.header, b.rows]) for b in blocks)


def test_the_study_hash_ignores_seed_and_prior_method_only():
    plugin = dataclasses.replace(PARAMS, seed=5, prior=dataclasses.replace(PARAMS.prior, method="plugin"))
    assert study_hash(plugin) == study_hash(PARAMS)
    assert "seed" not in study_keys() and "prior.method" not in study_keys() and "prior.seed" in study_keys()
    for other in (dataclasses.replace(PARAMS, n_groups=12),
                  dataclasses.replace(PARAMS, data=dataclasses.replace(PARAMS.data, noise=0.2)),
                  dataclasses.replace(PARAMS, transfer=dataclasses.replace(PARAMS.transfer, sizes=(2, 4))),
                  dataclasses.replace(PARAMS, prior=dataclasses.replace(PARAMS.prior, draws_per_sample=3))):
        assert study_hash(other) != study_hash(PARAMS)
    # the report's sections of params do not change what the transfer stages measure
    assert study_hash(dataclasses.replace(PARAMS, report=dataclasses.replace(PARAMS.report, grid_size=7))) == \
        study_hash(PARAMS)


def test_summary_and_table_over_synthetic_seeds():
    summary = transfer_seeds.summary(_rows(0.0))
    assert list(summary) == ["n2", "all"]
    n2 = summary["n2"]["informed - flat"]
    assert n2["mean"] == pytest.approx(0.1) and n2["se"] == pytest.approx(0.01 / math.sqrt(3))
    assert (n2["seeds"], n2["above_zero"], n2["below_zero"]) == (3, 3, 0)
    assert summary["all"]["informed - flat"]["above_zero"] == 1 and summary["all"]["informed - flat"]["below_zero"] == 1
    text = transfer_seeds.table({"seeds": _rows(0.0), "summary": summary})
    assert "| n2 | +0.100 +- 0.006; 3/3 | -0.050 +- 0.006; 0/3 | +0.150 +- 0.000; 3/3 |" in text
    assert text.endswith("fits not meeting the bar, over all seeds: flat 0, informed 0, hier_refit 1, hierarchical 0")
    one = transfer_seeds.summary(_rows(0.0)[:1])  # one seed: no se, written as null, shown as n/a
    assert math.isnan(one["n2"]["informed - flat"]["se"])
    assert transfer_seeds.strict(one)["n2"]["informed - flat"]["se"] is None
    assert "+0.090 +- n/a; 1/1" in transfer_seeds.table({"seeds": _rows(0.0)[:1], "summary": one})


def test_a_matching_study_is_shown_per_method_with_the_runs_own_first(tmp_path):
    path = tmp_path / "seeds.json"
    path.write_text(json.dumps(_study()))
    plugin_run = dataclasses.replace(PARAMS, prior=dataclasses.replace(PARAMS.prior, method="plugin"))
    blocks = seeds_blocks(read_study(path), plugin_run, path)
    tables = [b for b in blocks if isinstance(b, Table)]
    headings = [b.text for b in blocks if isinstance(b, Heading)]
    assert headings == ["Over data seeds", "prior.method: plugin", "prior.method: mvnormal"]
    assert [r[0] for r in tables[0].rows] == ["n2", "all"]  # in size order, though the file sorts its keys
    assert tables[0].rows[0] == ["n2", "+0.300 ± 0.006 (3 of 3 seeds > 0)", "-0.050 ± 0.006 (0 of 3 seeds > 0)"]
    assert tables[1].rows[0][1] == "+0.100 ± 0.006 (3 of 3 seeds > 0)"
    text = _texts(blocks)
    assert "Fits missing the convergence bar over all 3 seeds: flat 0, informed 0, hierarchical refit 1, " in text
    assert "seeds 31, 1, 2" in text and "commit 0123456789ab" in text and "prior.method (plugin) comes first" in text
    doc = _study()
    del doc["methods"]["plugin"]
    assert "prior.method (plugin) is not in the study" in _texts(seeds_blocks(doc, plugin_run, path))
    assert ("With prior.method plugin, over seeds the informed prior beats the flat prior beyond 2 standard errors "
            "at n2; is within 2 standard errors of the flat prior at all; against the hierarchical refit it falls "
            "behind beyond 2 standard errors at n2, all.") in text
    html = render_html("t", [], [Section("s", "h", blocks)], {})
    assert "+0.300 ± 0.006 (3 of 3 seeds &gt; 0)" in html
    assert "| n2 | +0.300 ± 0.006 (3 of 3 seeds \\> 0) |" in render_markdown("t", [], [Section("s", "h", blocks)])


def test_the_transfer_section_ends_with_the_study():
    from hbnn.model import likelihoods
    from hbnn.report.transfer_section import _transfer_section

    blocks = seeds_blocks(None, PARAMS, Path("benchmarks/transfer_seeds.json"))
    section = _transfer_section(None, likelihoods.get("bernoulli"), blocks)
    assert list(section.blocks[-1:]) == blocks and len(section.blocks) == 2  # after "run the transfer stages"


def test_the_reading_follows_the_numbers():
    summary = {"n2": {"informed - flat": {"mean": -0.03, "se": 0.01}},
               "n4": {"informed - flat": {"mean": 0.01, "se": 0.01}}}
    assert seeds_reading("mvnormal", summary) == (
        "With prior.method mvnormal, over seeds the informed prior falls behind the flat prior beyond 2 standard "
        "errors at n2; is within 2 standard errors of the flat prior at n4.")


def test_the_best_method_per_size_follows_the_numbers_and_the_prior_widths_are_the_runs():
    from hbnn.report.seeds_study import best_reading

    def diff(mean, se):
        return {"informed - flat": {"mean": mean, "se": se}}

    summaries = {"mvnormal": {"n2": diff(0.01, 0.01), "n4": diff(0.10, 0.01), "all": diff(0.05, 0.01)},
                 "plugin": {"n2": diff(0.10, 0.01), "n4": diff(0.09, 0.01)}}
    assert best_reading(summaries) == (
        "Which prior method transfers best, by its mean gain over the flat prior: plugin at n2 (ahead of the next "
        "method beyond 2 standard errors); mvnormal at n4 (within 2 standard errors of the next).")
    assert best_reading({"plugin": summaries["plugin"]}) == "No size was measured with more than one prior method."
    path = Path("benchmarks/transfer_seeds.json")
    layers = {"h10_h11": {"group_sd": {"mean": 0.2}, "prior_sd_mean": 1.1},
              "h2_h3": {"group_sd": {"mean": 0.3}, "prior_sd_mean": 1.2},
              "in": {"group_sd": {"mean": 0.02}, "prior_sd_mean": 0.96},
              "out": {"group_sd": {"mean": 3.7}, "prior_sd_mean": 3.9}}  # alphabetical, as prior.json stores them
    text = seeds_blocks(_study(), PARAMS, path, layers)[-1].text
    assert text.startswith("Which prior method transfers best, by its mean gain over the flat prior: plugin at n2 "
                           "(ahead of the next method beyond 2 standard errors); ")  # at all: the same numbers
    assert ("(prior.method: mvnormal) has mean marginal sds per layer of in 0.96 against 0.02, h2_h3 1.2 against 0.3, "
            "h10_h11 1.1 against 0.2, out 3.9 against 3.7 (") in text  # in the network's order
    assert "marginal sds" not in seeds_blocks(_study(), PARAMS, path, None)[-1].text


@pytest.mark.parametrize("change", ["n_groups", "complete"])
def test_a_study_of_other_params_or_unfinished_is_one_line_without_its_numbers(tmp_path, change):
    path = tmp_path / "seeds.json"
    other = dataclasses.replace(PARAMS, n_groups=30)
    path.write_text(json.dumps(_study(other) if change == "n_groups" else _study(complete=False)))
    blocks = seeds_blocks(read_study(path), PARAMS, path)
    assert len(blocks) == 1 and isinstance(blocks[0], Para)
    text = blocks[0].text
    assert "not shown" in text and "0.100" not in text and "0.300" not in text
    assert f"python -m benchmarks.transfer_seeds --methods mvnormal plugin --out {path}" in text
    assert ("measured for other params" in text) == (change == "n_groups")


def test_no_study_file_is_one_line(tmp_path):
    path = tmp_path / "absent.json"
    assert read_study(path) is None
    (para,) = seeds_blocks(None, PARAMS, path)
    assert para.text.startswith(f"Over data seeds: no study ({path} does not exist); python -m benchmarks")


@pytest.mark.parametrize(("text", "says"), [
    ("{not json", "is not valid JSON"),
    ("[]", "the file is a list, expected an object"),
    ('{"params_hash": "x"}', "complete is missing"),
])
def test_a_malformed_study_file_is_an_input_error_naming_it(tmp_path, text, says):
    path = tmp_path / "seeds.json"
    path.write_text(text)
    with pytest.raises(InputError, match=f"transfer seeds study {path}") as err:
        read_study(path)
    assert says in str(err.value)


def test_a_study_with_a_bad_number_names_the_key(tmp_path):
    doc = _study()
    doc["methods"]["plugin"]["summary"]["n2"]["informed - flat"]["mean"] = "high"
    path = tmp_path / "seeds.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"methods\.plugin\.summary\.n2\.informed - flat\.mean is a string"):
        read_study(path)


def test_the_committed_study_reads_and_matches_the_committed_params():
    """benchmarks/transfer_seeds.json: well formed, finished, both methods over six seeds, and of params.yaml."""
    from hbnn.config_read import load_params

    path = ROOT / "benchmarks" / "transfer_seeds.json"
    study = read_study(path)
    assert study is not None and study["complete"] is True and set(study["methods"]) == {"mvnormal", "plugin"}
    assert study["params_hash"] == study_hash(load_params(ROOT / "params.yaml"))
    blocks = seeds_blocks(study, load_params(ROOT / "params.yaml"), path)
    assert sum(isinstance(b, Table) for b in blocks) == 2
    assert all(len(m["seeds"]) == 6 for m in study["methods"].values())
