"""Transfer priors: which new-group prior derived from the hierarchical posterior comes close to the hierarchical refit?

Reads a finished transfer run (``traces/transfer/hier.nc``, the training groups' hierarchical posterior;
``data/tasks.nc``; ``params.yaml``; ``priors/transfer.nc``; the committed flat and informed traces and
``metrics/detail/transfer_refit.json``) and, for the held-out groups at the sizes asked for, on exactly the rows the
pipeline uses (:func:`hbnn.pipeline.transfer.refit_tasks`), fits each group with several priors and scores the
log predictive density of each test row (``log mean_s p(y_i | draw s)``):

``informed``
    The committed informed prior file (one MvNormal per layer over chain-aligned new-group draws), by NUTS.
``informed_ref``
    The same derivation from one chain (``prior.align: reference_chain``), by NUTS.
``joint``
    One MvNormal over every layer's weights at once (chain-aligned draws; cross-layer correlations kept), by NUTS.
``plugin``
    ``N(mu_s, sd_s^2 I)`` per layer at the hierarchical posterior's draw ``s`` of the highest log density: the
    informed prior file's layout, at one value of ``(mu, sd)`` rather than over all of them, by NUTS.
``mixture``
    The hierarchical model's own new-group prior with ``(mu, sd)`` marginalised over ``--components`` thinned
    posterior draws of both chains, ``p(w) = mean_s prod_layers N(w_layer; mu_s, sd_s^2 I)``, as a
    ``pm.Potential`` with a logsumexp over the components, by NUTS.
``mixture_is`` and ``informed_is``
    The same two priors by importance sampling from the prior (``--is-draws`` new-group draws, spread evenly over
    ``--is-components`` thinned posterior draws for the mixture, weighted by the likelihood of the group's training
    rows): no sampler, exact as the weights' effective sample size (printed) grows; ``informed_is`` checks the
    method against ``informed``'s NUTS fits.

NUTS fits use nutpie (numba) with ``--chains`` x ``--draws`` after ``--tune`` at the committed per-group sampler's
``target_accept``, one compile per prior, refitted per group with ``with_data``; R-hat and bulk ESS are those of the
test rows' predicted probabilities (the convergence bar's quantities), with divergences counted.

Printed per size and prior: mean test log loss, accuracy, and the paired per-row differences of the log predictive
density against the committed flat fit and against the committed hierarchical refit (mean and se); the committed
flat, informed and refit rows are printed as references. Then the seconds each prior's fits took.

Usage::

    python -m benchmarks.transfer_priors --root /work/main                 # sizes 2 4 8, every prior
    python -m benchmarks.transfer_priors --root . --sizes 2 --priors mixture_is informed_is --out /tmp/p.json
    python -m benchmarks.transfer_priors --root . --priors mixture_is --is-components 20   # how many components
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import logsumexp

PRIORS = ("informed", "informed_ref", "joint", "plugin", "mixture", "mixture_is", "informed_is")


def _softplus(x: np.ndarray) -> np.ndarray:
    """``log(1 + exp(x))`` without overflow."""
    return np.logaddexp(0.0, x)


def _loglik(logit: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bernoulli log density of ``y`` given ``logit`` (broadcast), per element."""
    return y * logit - _softplus(logit)


def forward(X: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    """The network's logits ``(draw, row)`` for weights with a leading draw axis (tanh, no bias)."""
    from hbnn.model.network import mlp_logit

    return mlp_logit(X[None], weights, np.tanh, False)


def row_lpd(logit: np.ndarray, y: np.ndarray, log_w: np.ndarray | None = None) -> np.ndarray:
    """Per test row ``log sum_s w_s p(y_i | s)`` with normalised weights (equal where ``log_w`` is None)."""
    ll = _loglik(logit, y)
    if log_w is None:
        return logsumexp(ll, axis=0) - np.log(ll.shape[0])
    return logsumexp(ll + (log_w - logsumexp(log_w))[:, None], axis=0)


def summarise(lpd: np.ndarray, prob: np.ndarray, y: np.ndarray) -> dict:
    """Mean test log loss and accuracy of per-row lpd and predictive probabilities."""
    return {"log_loss": float(-lpd.mean()), "accuracy": float(((prob > 0.5) == (y == 1)).mean())}


def paired(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of ``a - b`` over rows."""
    d = a - b
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))


@dataclasses.dataclass
class Fit:
    """One group's rows at one size."""

    group: str
    size: int
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    test_obs: np.ndarray  # the test rows' obs ids in the refit tasks (the committed traces' predictions coordinate)


def load_fits(root: Path, params, heldout: list[str], sizes: list[int]) -> list[Fit]:
    """The held-out groups' rows at each size, as the transfer stage builds them, in (size, group) order."""
    from hbnn.data.tasks import load_tasks
    from hbnn.pipeline.transfer import refit_tasks

    tasks = load_tasks(root / "data/tasks.nc")
    refit, refits, _ = refit_tasks(tasks, heldout, params.transfer)
    train, test = refit.split("train"), refit.split("test")
    code = {name: g for g, name in enumerate(refit.group_names)}
    out = []
    for n in sizes:
        for name in heldout:
            g = code[f"{name}/n{n}"]
            tr, te = train.rows(g), test.rows(g)
            out.append(Fit(name, n, train.X[tr], train.y[tr].astype(float), test.X[te], test.y[te].astype(float),
                           test.obs[te]))
    return out


def committed_lpd(root: Path, variant: str, fits: list[Fit]) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """Per (group, size): the committed ``traces/transfer/<variant>.nc`` fit's per-row lpd and predictive p."""
    import xarray as xr

    pred = xr.open_dataset(root / f"traces/transfer/{variant}.nc", group="predictions")["p"]
    out = {}
    for f in fits:
        p = pred.sel(obs=f.test_obs).transpose("chain", "draw", "obs").values.reshape(-1, f.y_test.size)
        lp = np.where(f.y_test == 1, np.log(p), np.log1p(-p))
        out[(f.group, f.size)] = (logsumexp(lp, axis=0) - np.log(lp.shape[0]), p.mean(axis=0))
    return out


class Population:
    """The hierarchical posterior's ``mu`` and ``sd`` per layer, and the priors derived from them."""

    def __init__(self, root: Path, params, specs):
        import xarray as xr

        from hbnn.model import prior

        self.root, self.params, self.specs = root, params, specs
        self.posterior = xr.open_dataset(root / "traces/transfer/hier.nc", group="posterior")
        self.mu = prior.layer_arrays(self.posterior, specs, "mu")  # per layer (chain, draw, *shape)
        self.sd = [self.posterior[f"sd_{s.name}"].transpose("chain", "draw").values for s in specs]

    def layer_prior(self, align: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer ``(mean, cov)`` as ``prior.derive`` makes them with ``prior.align = align``."""
        from hbnn.fitting.prior import derive
        from hbnn.pipeline.variants import STAGE_KEYS

        p = dataclasses.replace(self.params.prior, align=align)
        fitted, _ = derive(p, self.posterior, self.specs, "tanh", STAGE_KEYS["transfer_prior"], Path("hier.nc"))
        return {s.name: layer for s, layer in zip(self.specs, fitted, strict=True)}

    def plugin_prior(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per layer ``(mu_s, sd_s^2 I)`` at the posterior draw ``s`` of the highest log density: the hierarchical
        model's new-group prior at one value of ``(mu, sd)``, in the informed prior file's layout."""
        import xarray as xr

        logp = xr.open_dataset(self.root / "traces/transfer/hier.nc", group="sample_stats")["logp"]
        c, d = np.unravel_index(int(np.argmax(logp.transpose("chain", "draw").values)), self.sd[0].shape)
        return {s.name: (m[c, d].ravel(), float(sd[c, d]) ** 2 * np.eye(s.size))
                for s, m, sd in zip(self.specs, self.mu, self.sd, strict=True)}

    def committed_prior(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The committed ``priors/transfer.nc``."""
        import xarray as xr

        from hbnn.model.prior import prior_layers

        return prior_layers(xr.open_dataset(self.root / "priors/transfer.nc"), self.specs, "priors/transfer.nc")

    def aligned_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """Every chain's ``mu`` aligned to chain 0, flattened over layers ``(sample, weight)``, and ``sd`` per
        weight ``(sample, weight)``."""
        from hbnn.model.alignment import align_to_reference

        aligned = align_to_reference(self.mu, 0, True).mu
        mu = np.concatenate([m.reshape(m.shape[0] * m.shape[1], -1) for m in aligned], axis=1)
        sd = np.concatenate([np.repeat(s.reshape(-1, 1), s_.size, axis=1) for s, s_ in zip(self.sd, self.specs,
                                                                                              strict=True)], axis=1)
        return mu, sd

    def joint_prior(self, per_draw: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of chain-aligned new-group draws over all layers' weights at once."""
        mu, sd = self.aligned_flat()
        draws = (mu[:, None, :] + sd[:, None, :] * rng.standard_normal((mu.shape[0], per_draw, mu.shape[1])))
        draws = draws.reshape(-1, mu.shape[1])
        return draws.mean(axis=0), np.cov(draws, rowvar=False) + 1e-6 * np.eye(mu.shape[1])

    def components(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` evenly thinned posterior draws over both chains (unaligned): ``mu`` and ``sd`` per weight."""
        chains, draws = self.sd[0].shape
        keep = np.linspace(0, draws - 1, max(1, n // chains)).round().astype(int)
        mu = np.concatenate([m[:, keep].reshape(chains * keep.size, -1) for m in self.mu], axis=1)
        sd = np.concatenate([np.repeat(s[:, keep].reshape(-1, 1), s_.size, axis=1)
                             for s, s_ in zip(self.sd, self.specs, strict=True)], axis=1)
        return mu, sd


def split_layers(flat, specs) -> list:
    """Split flat weights ``(..., total)`` into the layers' shapes (NumPy or PyTensor)."""
    out, start = [], 0
    for s in specs:
        out.append(flat[..., start:start + s.size].reshape((*flat.shape[:-1], *s.shape)))
        start += s.size
    return out


def nuts_model(kind: str, specs, X: np.ndarray, y: np.ndarray, layer_prior=None, joint=None, mixture=None):
    """The PyMC model of one prior on one group's rows (``x``, ``y`` are ``pm.Data`` for ``with_data``)."""
    import pymc as pm
    import pytensor.tensor as pt

    from hbnn.model import likelihoods
    from hbnn.model.builders import build_informed_model
    from hbnn.model.network import mlp_logit

    if kind in ("informed", "informed_ref", "plugin"):
        return build_informed_model(X, y, ["x1", "x2"], [s.shape[-1] for s in specs[:-1]], layer_prior)
    total = sum(s.size for s in specs)
    with pm.Model(coords={"feature": ["x1", "x2"]}) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        if kind == "joint":
            mean, cov = joint
            z = pm.Normal("z", 0.0, 1.0, shape=total)
            flat = pt.as_tensor(mean) + pt.as_tensor(np.linalg.cholesky(cov)) @ z
        else:  # mixture: sum over components of prod over weights of N(w; mu_s, sd_s)
            mu, sd = mixture
            flat = pm.Flat("w_flat", shape=total)
            quad = ((flat[None, :] - mu) ** 2 / sd**2).sum(axis=1)
            pm.Potential("prior", pt.logsumexp(-0.5 * quad - np.log(sd).sum(axis=1)) - np.log(mu.shape[0]))
        weights = [pm.Deterministic(s.var, w) for s, w in zip(specs, split_layers(flat, specs), strict=True)]
        likelihoods.get("bernoulli").add_observed(mlp_logit(x, weights, pt.tanh, False), y_data, 1.0)
    return model


def convergence(p_test: np.ndarray) -> dict:
    """Max R-hat and min bulk ESS over the test rows' predicted probabilities ``(chain, draw, row)``."""
    import arviz as az
    import xarray as xr

    ds = xr.Dataset({"p": (("chain", "draw", "obs"), p_test)})
    return {"rhat_max": float(az.rhat(ds)["p"].max()), "ess_min": float(az.ess(ds, method="bulk")["p"].min())}


def run_nuts(kind: str, fits: list[Fit], specs, args, **prior) -> dict:
    """Fit every group with one prior by nutpie; per (group, size) the lpd, p, diagnostics and seconds."""
    import nutpie

    t0 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(nuts_model(kind, specs, fits[0].X, fits[0].y, **prior), backend="numba")
    compile_s = time.perf_counter() - t0
    out = {"compile_seconds": compile_s, "fits": {}}
    for i, f in enumerate(fits):
        t = time.perf_counter()
        trace = nutpie.sample(compiled.with_data(x=f.X, y=f.y), chains=args.chains, draws=args.draws, tune=args.tune,
                              seed=1000 + i, target_accept=args.target_accept, progress_bar=False,
                              cores=args.chains)
        post = trace.posterior
        w = [post[s.var].values.reshape(-1, *s.shape) for s in specs]
        logit = forward(f.X_test, w)
        p = 1.0 / (1.0 + np.exp(-logit))
        diag = convergence(p.reshape(args.chains, args.draws, -1))
        diag["divergences"] = int(trace.sample_stats["diverging"].values.sum())
        diag["seconds"] = time.perf_counter() - t
        out["fits"][(f.group, f.size)] = (row_lpd(logit, f.y_test), p.mean(axis=0), diag)
    return out


def run_is(draw_weights, fits: list[Fit], specs) -> dict:
    """Importance sampling from a prior: ``draw_weights()`` gives flat new-group weights ``(draw, total)``."""
    t0 = time.perf_counter()
    w = split_layers(draw_weights(), specs)
    out = {"compile_seconds": 0.0, "fits": {}, "draw_seconds": time.perf_counter() - t0}
    for f in fits:
        t = time.perf_counter()
        log_w = _loglik(forward(f.X, w), f.y).sum(axis=1)
        logit = forward(f.X_test, w)
        norm = np.exp(log_w - logsumexp(log_w))
        ess = float(1.0 / (norm**2).sum())
        p = norm @ (1.0 / (1.0 + np.exp(-logit)))
        out["fits"][(f.group, f.size)] = (row_lpd(logit, f.y_test, log_w), p,
                                          {"is_ess": ess, "seconds": time.perf_counter() - t})
    return out


def table(results: dict, reference: dict, fits: list[Fit], sizes: list[int]) -> list[dict]:
    """Per size and prior: log loss, accuracy, differences against flat and refit, and the worst diagnostics.

    ``results`` maps each prior's name to its :func:`run_nuts` or :func:`run_is` answer; ``reference`` holds the
    ``flat`` and ``refit`` fits' per-(group, size) values the differences are taken against.
    """
    rows = []
    for n in sizes:
        at = [f for f in fits if f.size == n]
        y = np.concatenate([f.y_test for f in at])
        flat = np.concatenate([reference["flat"][(f.group, n)][0] for f in at])
        refit = np.concatenate([reference["refit"][(f.group, n)][0] for f in at])
        for name, res in results.items():
            lpd = np.concatenate([res["fits"][(f.group, n)][0] for f in at])
            prob = np.concatenate([res["fits"][(f.group, n)][1] for f in at])
            row = {"size": n, "prior": name, **summarise(lpd, prob, y)}
            row["vs_flat"], row["vs_refit"] = paired(lpd, flat), paired(lpd, refit)
            diags = [res["fits"][(f.group, n)][2] for f in at if len(res["fits"][(f.group, n)]) > 2]
            if diags and "rhat_max" in diags[0]:
                row["rhat_max"] = max(d["rhat_max"] for d in diags)
                row["ess_min"] = min(d["ess_min"] for d in diags)
                row["divergences"] = sum(d["divergences"] for d in diags)
            if diags and "is_ess" in diags[0]:
                row["is_ess_min"] = min(d["is_ess"] for d in diags)
            if diags:
                row["seconds_per_fit"] = float(np.mean([d["seconds"] for d in diags]))
            rows.append(row)
    return rows


def print_table(rows: list[dict], seconds: dict) -> None:
    """Print the rows, then each prior's total seconds."""
    print(f"{'size':>4} {'prior':<13} {'logloss':>8} {'acc':>6} {'vs flat (se)':>17} {'vs refit (se)':>17} "
          f"{'rhat':>6} {'ess':>6} {'div':>4} {'is_ess':>7} {'s/fit':>6}")
    for r in rows:
        extra = (f"{r.get('rhat_max', float('nan')):6.3f} {r.get('ess_min', float('nan')):6.0f} "
                 f"{r.get('divergences', 0):4d} {r.get('is_ess_min', float('nan')):7.0f} "
                 f"{r.get('seconds_per_fit', float('nan')):6.2f}")
        print(f"{r['size']:>4} {r['prior']:<13} {r['log_loss']:8.4f} {r['accuracy']:6.3f} "
              f"{r['vs_flat'][0]:+8.4f} ({r['vs_flat'][1]:.4f}) {r['vs_refit'][0]:+8.4f} ({r['vs_refit'][1]:.4f}) "
              f"{extra}")
    for name, s in seconds.items():
        print(f"{name}: {s:.1f} s in all")


def main(argv: list[str] | None = None) -> int:
    """Fit, score and print; optionally write the rows as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="a checkout with the transfer stages' outputs")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--priors", nargs="+", default=list(PRIORS), choices=PRIORS)
    ap.add_argument("--components", type=int, default=200, help="mixture components (thinned posterior draws)")
    ap.add_argument("--is-draws", type=int, default=100_000, help="importance draws (prior draws) per prior")
    ap.add_argument("--is-components", type=int, default=0,
                    help="mixture_is: thinned posterior draws it mixes over (0: every draw)")
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--tune", type=int, default=300)
    ap.add_argument("--out", type=Path, help="write the table's rows here as JSON")
    args = ap.parse_args(argv)

    from hbnn.config_read import load_params
    from hbnn.model.network import layer_specs

    root = args.root
    params = load_params(root / "params.yaml")
    args.target_accept = params.sampler.target_accept
    specs = layer_specs(2, params.model.hidden_layers, params.model.bias)
    heldout = json.loads((root / "metrics/detail/transfer_prior.json").read_text())["heldout_groups"]
    fits = load_fits(root, params, heldout, args.sizes)
    refit_json = json.loads((root / "metrics/detail/transfer_refit.json").read_text())["sizes"]
    reference = {"flat(c)": committed_lpd(root, "flat", fits), "informed(c)": committed_lpd(root, "informed", fits)}
    refit = {}
    for n in args.sizes:
        lpd = np.asarray(refit_json[f"n{n}"]["row_lpd"])
        at = [f for f in fits if f.size == n]
        for f, part in zip(at, np.split(lpd, np.cumsum([f.y_test.size for f in at])[:-1]), strict=True):
            # p(y_i) from its lpd, turned into p(y_i = 1) for the accuracy
            refit[(f.group, n)] = (part, np.where(f.y_test == 1, np.exp(part), 1.0 - np.exp(part)))
    reference["refit(c)"] = refit
    reference = {k: {"fits": v} for k, v in reference.items()}
    ref = {"flat": reference["flat(c)"]["fits"], "refit": reference["refit(c)"]["fits"]}

    pop = Population(root, params, specs)
    rng = np.random.default_rng(7)
    results, seconds = {}, {}
    for kind in args.priors:
        t0 = time.perf_counter()
        if kind == "informed":
            results[kind] = run_nuts(kind, fits, specs, args, layer_prior=pop.committed_prior())
        elif kind == "plugin":
            results[kind] = run_nuts(kind, fits, specs, args, layer_prior=pop.plugin_prior())
        elif kind == "informed_ref":
            results[kind] = run_nuts(kind, fits, specs, args, layer_prior=pop.layer_prior("reference_chain"))
        elif kind == "joint":
            results[kind] = run_nuts(kind, fits, specs, args, joint=pop.joint_prior(10, rng))
        elif kind == "mixture":
            results[kind] = run_nuts(kind, fits, specs, args, mixture=pop.components(args.components))
        elif kind == "mixture_is":
            mu, sd = pop.components(args.is_components or pop.sd[0].size)  # 0: every posterior draw
            per = max(1, args.is_draws // mu.shape[0])
            mu, sd = np.repeat(mu, per, 0), np.repeat(sd, per, 0)
            results[kind] = run_is(lambda mu=mu, sd=sd: mu + sd * rng.standard_normal(mu.shape), fits, specs)
        else:  # informed_is
            layers = pop.committed_prior()
            count = args.is_draws

            def draw(layers=layers, count=count):
                return np.concatenate([rng.multivariate_normal(*layers[s.name], size=count) for s in specs], axis=1)

            results[kind] = run_is(draw, fits, specs)
        seconds[kind] = time.perf_counter() - t0
        print(f"{kind}: done in {seconds[kind]:.1f} s (compile {results[kind]['compile_seconds']:.1f} s)",
              file=sys.stderr, flush=True)
    rows = table({**reference, **results}, ref, fits, args.sizes)
    print_table(rows, seconds)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
