"""Who voted for Dole in 1996, by education level: the three models from Python, on a public grouped table.

The data: the 1996 American National Election Study as statsmodels ships it (``statsmodels.datasets.anes96``),
944 voters in 7 education levels of 13 to 248 voters each; the label is the vote (1: Dole, 0: Clinton). Education
levels are the groups: the smallest has too few voters to fit a network of its own, which is what partial pooling
is for.

The example fits the hierarchical, flat and informed BNNs on 70% of each group's voters (:class:`hbnn.HierarchicalBNN`,
:class:`hbnn.FlatBNN`, :class:`hbnn.InformedBNN`), scores them on the other 30% beside a logistic regression with
group effects (what a user would try first), compares them with ``az.compare`` (PSIS-LOO on the training rows),
draws one group's predictive uncertainty, and cross-validates the hierarchical model by group, so every test fold
holds education levels the model has not seen (predicted through the population).

Run it from the repository root, in the project's environment::

    python examples/anes96_vote.py               # the default sampler settings (a few minutes on 2 cores)
    python examples/anes96_vote.py --quick       # tiny settings: runs in about a minute, does not converge

It writes ``anes96_group.png`` into ``--out`` (default ``reports/examples``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import arviz as az
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.compose import make_column_transformer  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, log_loss  # noqa: E402
from sklearn.model_selection import GroupKFold, cross_val_score, train_test_split  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

import hbnn  # noqa: E402

FEATURES = ["selfLR", "PID", "age", "income", "TVnews", "logpopul"]
LEVELS = {1: "1-8 grades", 2: "some high school", 3: "high school", 4: "some college", 5: "college",
          6: "master's", 7: "PhD"}
# --quick: short chains for a smoke run (CI); the numbers it prints are not converged and say so
QUICK = {"tune": 100, "draws": 100, "max_draws": 0}
QUICK_HIER = {**QUICK, "restarts": 0}


def voters() -> tuple[pd.DataFrame, pd.Series]:
    """The features, the education level (the group) and a 70/30 split stratified by level and vote; the votes."""
    from statsmodels.datasets import anes96

    df = anes96.load_pandas().data
    X = df[FEATURES].copy()
    X["education"] = df["educ"].astype(int).map(LEVELS)
    y = df["vote"].astype(int).rename("vote_dole")
    train, _ = train_test_split(np.arange(len(df)), train_size=0.7, random_state=0,
                                stratify=X["education"] + "/" + y.astype(str))
    X["split"] = np.where(np.isin(np.arange(len(df)), train), "train", "test")
    return X, y


def logistic_baseline(X: pd.DataFrame, y: pd.Series) -> dict[str, float]:
    """A logistic regression with standardised features and one-hot education levels, on the same split."""
    model = make_pipeline(make_column_transformer((StandardScaler(), FEATURES), (OneHotEncoder(), ["education"])),
                          LogisticRegression(max_iter=1000))
    train, test = X["split"] == "train", X["split"] == "test"
    model.fit(X[train], y[train])
    p = model.predict_proba(X[test])[:, 1]
    return {"accuracy": accuracy_score(y[test], p >= 0.5), "log_loss": log_loss(y[test], p)}


def plot_group(models: dict, X: pd.DataFrame, group: str, out: Path) -> Path:
    """P(vote Dole) against self-placement on the left-right scale, other features at their medians, with each
    model's 94% interval, for one education level."""
    grid = pd.DataFrame({f: np.full(50, X[f].median()) for f in FEATURES})
    grid["selfLR"] = np.linspace(X["selfLR"].min(), X["selfLR"].max(), 50)
    grid["education"] = group
    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, model), color in zip(models.items(), ("tab:blue", "tab:gray", "tab:orange"), strict=False):
        s = model.predict_summary(grid)
        ax.plot(grid["selfLR"], s["mean"], color=color, label=name)
        ax.fill_between(grid["selfLR"], s["lower_94"], s["upper_94"], color=color, alpha=0.2)
    seen = X[(X["education"] == group) & (X["split"] == "train")]
    ax.set(xlabel="self-placement, 1 (liberal) to 7 (conservative)", ylabel="P(vote Dole)",
           title=f"{group}: {len(seen)} training voters; bands: 94% intervals")
    ax.legend()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "anes96_group.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sampler settings (a smoke run; not converged)")
    parser.add_argument("--out", type=Path, default=Path("reports/examples"), help="where the figure goes")
    args = parser.parse_args(argv)
    X, y = voters()
    common = {"group": "education", "split": "split", "bias": True}  # biases: a table's features are not centred
    hier = hbnn.HierarchicalBNN(**common, **(QUICK_HIER if args.quick else {})).fit(X, y)
    flat = hbnn.FlatBNN(**common, **(QUICK if args.quick else {})).fit(X, y)
    informed = hbnn.InformedBNN(hier, **common, **(QUICK if args.quick else {})).fit(X, y)
    models = {"hierarchical": hier, "flat": flat, "informed": informed}

    rows = {name: {"accuracy": m.metrics_["test"]["accuracy"], "log_loss": m.metrics_["test"]["log_loss"],
                   "groups converged": f"{int(m.diagnostics()['converged'].sum())}/{len(m.groups_)}"}
            for name, m in models.items()}
    rows["logistic regression + education"] = {**logistic_baseline(X, y), "groups converged": "-"}
    print("Test rows (30% of each education level):")
    print(pd.DataFrame(rows).T.round(3).to_string())
    print("\nPSIS-LOO on the training rows (az.compare):")
    print(az.compare({name: m.idata_ for name, m in models.items()}).round(2).to_string())
    print("\nHierarchical model, convergence per education level:")
    print(hier.diagnostics().round(3).to_string())
    smallest = X["education"].value_counts().idxmin()
    print(f"\nFigure: {plot_group(models, X, smallest, args.out)}")

    unsplit = X.drop(columns="split")
    cv = GroupKFold(n_splits=3)
    bnn = cross_val_score(hbnn.HierarchicalBNN(group="education", bias=True, **(QUICK_HIER if args.quick else {})),
                          unsplit, y, cv=cv, groups=unsplit["education"])
    plain = cross_val_score(make_pipeline(make_column_transformer((StandardScaler(), FEATURES)),
                                          LogisticRegression(max_iter=1000)),
                            unsplit, y, cv=cv, groups=unsplit["education"])
    print("\nAccuracy on education levels left out of the fit (GroupKFold, 3 folds):")
    print(f"  hierarchical BNN (population) {bnn.mean():.3f} ({', '.join(f'{s:.3f}' for s in bnn)})")
    print(f"  logistic regression           {plain.mean():.3f} ({', '.join(f'{s:.3f}' for s in plain)})")


if __name__ == "__main__":
    main()
