"""Which groups the report draws surfaces for (report.surface_groups), and the per-group charts of many groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from hbnn.config import Params, ReportParams
from hbnn.report import metric_plots, sections
from hbnn.report.document import Table, render_markdown
from hbnn.report.numbers import MODELS
from hbnn.report.selection import choice_blocks, choose_surface_groups

ROOT = Path(__file__).resolve().parents[1]


def _metrics(n: int, seed: int = 0, missing: dict[str, list[int]] | None = None,
             flagged: dict[str, list[int]] | None = None) -> tuple[dict, list[str]]:
    """Detail metrics of ``n`` groups with random test log losses; ``missing[model]``: groups that miss the bar,
    ``flagged[model]``: groups flagged as non-mixing."""
    rng = np.random.default_rng(seed)
    names = [f"g{i:04d}" for i in range(n)]
    out = {}
    for v in MODELS:
        per_group = {g: {"converged": i not in (missing or {}).get(v, []),
                         "test": {"log_loss": float(rng.uniform(0.1, 0.5)), "accuracy": 0.9}}
                     for i, g in enumerate(names)}
        out[v] = {"per_group": per_group,
                  "sampling": {"flagged_groups": {names[i]: {"reason": "x"} for i in (flagged or {}).get(v, [])}}}
    return out, names


def test_the_groups_that_miss_the_bar_come_first_then_each_models_worst_then_a_sample():
    metrics, names = _metrics(200, missing={"flat": [7, 50], "hierarchical": [50]}, flagged={"informed": [120]})
    metrics["hierarchical"]["per_group"]["g0033"]["test"]["log_loss"] = 9.0  # the hierarchical model's worst
    metrics["flat"]["per_group"]["g0150"]["test"]["log_loss"] = 8.0  # the flat model's worst
    choice = choose_surface_groups(metrics, names, 12, seed=31)
    assert len(choice.groups) == len(set(choice.groups)) == 12 and not choice.every_group
    # missing in two models first, then the others that miss or are flagged (the worse-fitted first)
    assert choice.groups[0] == 50 and set(choice.groups[:3]) == {7, 50, 120}
    assert all(r.startswith("misses the convergence bar") for r in choice.reasons[:3])
    assert "Flat, Hierarchical" in choice.reasons[0]
    # then the worst-fitted of each model in turn, in the models' order
    assert choice.groups[3:5] == (150, 33)
    assert choice.reasons[3] == "highest test log loss, Flat: rank 1 of 200 (8)"
    assert choice.reasons[4] == "highest test log loss, Hierarchical: rank 1 of 200 (9)"
    # at least a quarter of the places go to the seeded sample, in the tasks' order
    sample = [g for g, r in zip(choice.groups, choice.reasons, strict=True) if r.startswith("seeded sample")]
    assert len(sample) == 3 and sample == sorted(sample) and not set(sample) & {7, 50, 120, 150, 33}


def test_the_groups_that_miss_the_bar_take_at_most_half_the_places():
    metrics, names = _metrics(100, missing={"flat": list(range(0, 100, 2))})
    choice = choose_surface_groups(metrics, names, 10, seed=1)
    reasons = [r.split(",")[0].split(":")[0] for r in choice.reasons]
    assert reasons.count("misses the convergence bar or is flagged") == 5 and choice.n_missing == 50
    assert all(g % 2 == 0 for g in choice.groups[:5])
    assert any(r.startswith("highest test log loss") for r in reasons)
    assert any(r.startswith("seeded sample") for r in reasons)
    para, _ = choice_blocks(choice, names, 36)
    assert "(5 of the 50 such groups;" in para.text


def test_a_model_that_misses_the_bar_in_every_group_singles_out_none():
    metrics, names = _metrics(100, missing={"hierarchical": list(range(100)), "flat": [42]})
    choice = choose_surface_groups(metrics, names, 10, seed=1)
    assert choice.groups[0] == 42 and choice.reasons[0] == "misses the convergence bar or is flagged: Flat"
    assert choice.n_missing == 1 and not any(r.startswith("misses") for r in choice.reasons[1:])


def test_the_choice_is_the_same_for_the_same_params_and_moves_with_the_seed():
    metrics, names = _metrics(300, missing={"flat": [3]})
    first = choose_surface_groups(metrics, names, 20, seed=31)
    assert choose_surface_groups(metrics, names, 20, seed=31) == first
    other = choose_surface_groups(metrics, names, 20, seed=32)
    assert other.groups[:15] == first.groups[:15]  # the needed groups do not depend on the seed
    assert other.groups[15:] != first.groups[15:]  # the sample does


@pytest.mark.parametrize("limit", [0, 18, 36])
def test_zero_or_a_limit_past_the_groups_draws_every_group_in_order(limit):
    metrics, names = _metrics(18, missing={"flat": [4]})
    choice = choose_surface_groups(metrics, names, limit, seed=31)
    assert choice.every_group and choice.groups == tuple(range(18))
    (para,) = choice_blocks(choice, names, 36)
    assert para.text.startswith("Every group's surfaces are drawn (18 groups; report.surface_groups: ")


def test_the_default_draws_every_group_of_the_default_data():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    limit = params["report"].get("surface_groups", ReportParams().surface_groups)
    assert limit == 0 or limit >= params["n_groups"] == Params().n_groups
    assert ReportParams().surface_groups >= Params().n_groups


def test_regression_groups_are_ranked_by_their_test_lpd_lowest_first():
    metrics, names = _metrics(50)
    for v in MODELS:
        for i, g in enumerate(names):
            metrics[v]["per_group"][g]["test"] = {"lpd": -float(i), "rmse": 1.0}
    choice = choose_surface_groups(metrics, names, 4, seed=0, classifier=False)
    assert choice.groups[0] == 49 and choice.reasons[0] == "lowest test lpd, Flat: rank 1 of 50 (-49)"
    assert choice.groups[1] == 48 and choice.reasons[1] == "lowest test lpd, Hierarchical: rank 2 of 50 (-48)"


def test_the_report_says_which_groups_were_drawn_why_and_how_to_draw_the_rest():
    metrics, names = _metrics(100, missing={"flat": [9]})
    choice = choose_surface_groups(metrics, names, 8, seed=31)
    para, table = choice_blocks(choice, names, 4)
    assert isinstance(table, Table) and len(table.rows) == 8
    assert table.rows[0] == ["1, 1", "g0009", "misses the convergence bar or is flagged: Flat"]
    assert table.rows[4][0] == "2, 1"  # 4 panels a page
    assert "8 of the 100 groups (report.surface_groups: 8)" in para.text
    assert "report.surface_groups: 0 (every group)" in para.text and "seed (31)" in para.text
    assert "g0009" in render_markdown("t", [], [sections.Section("s", "h", [para, table])])


def test_per_group_charts_of_many_groups_show_every_group_sorted_on_one_axes():
    n = metric_plots.NAMED_GROUPS_MAX + 1
    rng = np.random.default_rng(0)
    values = {v: rng.uniform(0.5, 1.0, n) for v in MODELS}
    values["flat"][3] = np.nan
    fig, axes = metric_plots.plot_per_group([f"g{i}" for i in range(n)], values, kind="bar", ylabel="acc",
                                            hlines=(0.75,))
    (ax,) = axes
    lines = [line for line in ax.get_lines() if line.get_label() in {*MODELS, "flat (1 missing)"}]
    assert [line.get_xdata().size for line in lines] == [n - 1, n, n]
    assert all(np.all(np.diff(line.get_ydata()) >= 0) for line in lines)
    assert "flat (1 missing)" in [t.get_text() for t in ax.get_legend().get_texts()]
    few, few_axes = metric_plots.plot_per_group([f"g{i}" for i in range(n - 1)], {"flat": np.ones(n - 1)})
    assert len(few_axes) == 3  # named bars, wrapped every GROUPS_PER_ROW groups
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(few)


def test_a_sorted_per_group_chart_names_each_models_worst_groups():
    n = metric_plots.NAMED_GROUPS_MAX + 1
    names = [f"g{i}" for i in range(n)]
    values = {v: np.linspace(0.6, 1.0, n) for v in MODELS}
    section = sections._per_group_section(n, values, names)
    (para,) = [b for b in section.blocks if isinstance(b, sections.Para)]
    assert para.text.startswith("Lowest test accuracy (5 groups a model): Flat: g0 (0.6), g1 ")
    assert "sorted within each model" in section.blocks[0].caption
    assert not [b for b in sections._per_group_section(18, values, names[:18]).blocks if isinstance(b, sections.Para)]
