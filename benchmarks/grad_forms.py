"""Compare formulations of the hierarchical BNN's logp+gradient under pytensor's NUMBA mode.

Every form builds the default hierarchical model (same free variables, same
log density) but writes the likelihood graph differently. For each form we

1. build the logp+dlogp function exactly as nutpie does
   (``nutpie.compile_pymc._make_functions(model, mode="NUMBA", ...)``),
2. check its value and gradient against the baseline at random points, and
3. time its numba ``jit_fn`` directly from a numba loop (no Python per call):
   minimum over repeats of wall time and of thread CPU time per call
   (CPU time is less sensitive to the other jobs sharing the 2 cores).

``--sample`` also compiles the form with ``nutpie.compile_pymc_model`` and
samples a fixed number of draws with a fixed seed on one chain, reporting
sampling seconds / total leapfrog steps (``n_steps`` in sample_stats).

    python benchmarks/grad_forms.py                    # all forms, direct timing
    python benchmarks/grad_forms.py baseline fused     # some forms
    python benchmarks/grad_forms.py --sample baseline  # plus nutpie sampling
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt

from hbnn.config_read import parse_params
from hbnn.data.moons import make_moons_tasks
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks
from hbnn.model.builders import build_hierarchical_model
from hbnn.model.network import layer_coords, layer_specs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy_floor  # noqa: E402

# ---------------------------------------------------------------------------
# Forms. Each takes (X_padded, y, valid, names, features, hidden) like
# build_hierarchical_model and returns a pm.Model with the same free RVs.
# ---------------------------------------------------------------------------


def _weights(specs, deterministic=True):
    ws = []
    for s in specs:
        mu = pm.Normal(f"mu_{s.name}", 0.0, 1.0, dims=s.dims)
        sd = pm.HalfNormal(f"sd_{s.name}", 1.0)
        z = pm.Normal(f"z_{s.name}", 0.0, 1.0, dims=("group", *s.dims))
        w = mu + sd * z
        det = pm.Deterministic(s.var, w, dims=("group", *s.dims))
        ws.append(det if deterministic else w)
    return ws


def _model(X, y, valid, names, features, hidden, forward, *, deterministic=True, likelihood="bernoulli",
           gather="auto", dtype="float64"):
    """Generic builder: ``forward(x, weights) -> logit (group, row)``."""
    specs = layer_specs(len(features), hidden)
    coords = layer_coords(features, hidden)
    coords["group"] = list(names)
    ragged = valid.size != X.shape[0] * X.shape[1]
    with pm.Model(coords=coords) as model:
        x = pm.Data("x", X, dims=("group", "row", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        ws = _weights(specs, deterministic)
        xin = x
        if dtype != "float64":
            xin = x.astype(dtype)
            ws = [w.astype(dtype) for w in ws]
        logit = forward(xin, ws, [sp.shape for sp in specs], len(names)).reshape((-1,))
        if ragged or gather == "always":
            logit = logit[pt.as_tensor(valid)]
        if dtype != "float64":
            logit = logit.astype("float64")
        if likelihood == "bernoulli":
            pm.Bernoulli("y_obs", logit_p=logit, observed=y_data, dims="obs")
        elif likelihood == "customdist":  # observed RV with a hand-written Bernoulli-logit logp
            pm.CustomDist("y_obs", logit, logp=lambda value, lg: value * lg - pt.softplus(lg),
                          observed=y_data, dims="obs")
        else:  # hand-written Bernoulli-logit log-likelihood as a Potential
            pm.Potential("y_obs", (y_data * logit - pt.softplus(logit)).sum())
    return model


def fwd_matmul(x, ws, shapes=None, G=None):  # the current mlp_logit
    h = x
    for w in ws[:-1]:
        h = pt.tanh(h @ w)
    return (h @ ws[-1][..., None])[..., 0]


def fwd_matmul_fused_out(x, ws, shapes=None, G=None):
    h = x
    for w in ws[:-1]:
        h = pt.tanh(h @ w)
    return (h * ws[-1][:, None, :]).sum(-1)


def fwd_batched_dot(x, ws, shapes=None, G=None):
    h = x
    for w in ws[:-1]:
        h = pt.tanh(pt.batched_dot(h, w))
    return pt.batched_dot(h, ws[-1][..., None])[..., 0]


def fwd_einsum(x, ws, shapes=None, G=None):
    h = x
    for w in ws[:-1]:
        h = pt.tanh(pt.einsum("gri,gio->gro", h, w))
    return pt.einsum("gri,gi->gr", h, ws[-1])


def fwd_bcast(x, ws, shapes=None, G=None):
    h = x
    for w in ws[:-1]:
        h = pt.tanh((h[:, :, :, None] * w[:, None, :, :]).sum(2))
    return (h * ws[-1][:, None, :]).sum(-1)


def fwd_bcast_unrolled(x, ws, shapes, G, fused_out=True):
    """Sum over the (tiny) input axis written as explicit adds of rank-1 products (no BLAS)."""
    h = x
    for w, (n_in, _) in zip(ws[:-1], shapes[:-1], strict=True):
        a = h[:, :, 0, None] * w[:, None, 0, :]
        for i in range(1, n_in):
            a = a + h[:, :, i, None] * w[:, None, i, :]
        h = pt.tanh(a)
    w = ws[-1]
    out = h[:, :, 0] * w[:, None, 0]
    for i in range(1, shapes[-1][0]):
        out = out + h[:, :, i] * w[:, None, i]
    return out


def fwd_unrolled_first(x, ws, shapes, G):
    """Unrolled rank-1 sum only for the input layer (2 features); matmul elsewhere, fused output."""
    w = ws[0]
    a = x[:, :, 0, None] * w[:, None, 0, :]
    for i in range(1, shapes[0][0]):
        a = a + x[:, :, i, None] * w[:, None, i, :]
    h = pt.tanh(a)
    for w in ws[1:-1]:
        h = pt.tanh(h @ w)
    return (h * ws[-1][:, None, :]).sum(-1)


def fwd_transposed(x, ws, shapes=None, G=None):
    """Activations as (group, unit, row): w^T @ h^T, rows on the contiguous axis."""
    h = x.transpose(0, 2, 1)
    for w in ws[:-1]:
        h = pt.tanh(w.transpose(0, 2, 1) @ h)
    return (ws[-1][:, None, :] @ h)[:, 0, :]


def fwd_blockdiag(x, ws, shapes, G):
    """Groups folded into one 2-D matmul against a block-diagonal weight matrix."""
    R = x.shape[1]
    h = x.transpose(1, 0, 2).reshape((R, -1))  # (row, group*in)
    eye = pt.eye(G)
    for w, (n_in, n_out) in zip(ws[:-1], shapes[:-1], strict=True):
        big = (w[:, :, None, :] * eye[:, None, :, None]).reshape((G * n_in, G * n_out))
        h = pt.tanh(h @ big)
    (n_in,) = shapes[-1]
    big = (ws[-1][:, :, None] * eye[:, None, :]).reshape((G * n_in, G))
    return (h @ big).T  # (group, row)


def fwd_fold2d(x, ws, shapes, G):
    """Input layer as ONE 2-D matmul of all rows against all groups' weights, keeping the diagonal blocks."""
    R = x.shape[1]
    D, H = shapes[0]
    allw = ws[0].transpose(1, 0, 2).reshape((D, G * H))  # (in, group*out)
    a = (x.reshape((G * R, D)) @ allw).reshape((G, R, G, H))
    idx = pt.arange(G)
    h = pt.tanh(a[idx, :, idx, :])  # (G, R, H)
    for w in ws[1:-1]:
        h = pt.tanh(h @ w)
    return (h * ws[-1][:, None, :]).sum(-1)


FORMS: dict[str, Callable] = {
    "baseline": lambda *a: _model(*a, fwd_matmul),
    "models.py": lambda *a: build_hierarchical_model(*a),  # whatever src/hbnn/model/builders.py builds now
    "batched_dot": lambda *a: _model(*a, fwd_batched_dot),
    "einsum": lambda *a: _model(*a, fwd_einsum),
    "bcast_sum": lambda *a: _model(*a, fwd_bcast),
    "bcast_unrolled": lambda *a: _model(*a, fwd_bcast_unrolled),
    "transposed": lambda *a: _model(*a, fwd_transposed),
    "blockdiag": lambda *a: _model(*a, fwd_blockdiag),
    "fold2d_in": lambda *a: _model(*a, fwd_fold2d),
    "fused_out": lambda *a: _model(*a, fwd_matmul_fused_out),
    "gather_always": lambda *a: _model(*a, fwd_matmul, gather="always"),
    "no_deterministic": lambda *a: _model(*a, fwd_matmul, deterministic=False),
    "potential": lambda *a: _model(*a, fwd_matmul, likelihood="potential"),
    "float32": lambda *a: _model(*a, fwd_matmul, dtype="float32"),
    "unrolled_potential": lambda *a: _model(*a, fwd_bcast_unrolled, likelihood="potential"),
    "fused_out_potential": lambda *a: _model(*a, fwd_matmul_fused_out, likelihood="potential"),
    "customdist": lambda *a: _model(*a, fwd_matmul, likelihood="customdist"),
    "fused_out_customdist": lambda *a: _model(*a, fwd_matmul_fused_out, likelihood="customdist"),
    "unrolled_first": lambda *a: _model(*a, fwd_unrolled_first),
    "unrolled_first_potential": lambda *a: _model(*a, fwd_unrolled_first, likelihood="potential"),
}


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def default_data():
    params = parse_params({})
    tasks = Tasks(make_moons_tasks(DataSpec.of(params)))
    pad = tasks.padded("train")
    return (pad.X, pad.y, pad.valid, tasks.group_names, tasks.features, params.model.hidden_layers), pad


def nutpie_logp_function(model):
    """The pytensor Function nutpie compiles (logp, grad) from ``model``, and its shared inputs."""
    import nutpie.compile_pymc as ncp
    from pymc.initial_point import make_initial_point_fn

    ip = make_initial_point_fn(model=model, return_transformed=True)
    n_dim, _, logp_fn_pt, _, _, shape_info = ncp._make_functions(
        model, mode="NUMBA", compute_grad=True, join_expanded=True, pymc_initial_point_fn=ip, var_names=None
    )
    shared = tuple(np.asarray(v.get_value()) for v in logp_fn_pt.get_shared())
    return n_dim, logp_fn_pt, shared, shape_info


@numba.njit
def _sum_calls(fn, n, x, shared):
    acc = 0.0
    for i in range(n):
        x[0] += 1e-12 * ((i & 1) * 2 - 1)
        lp, g = fn(x, *shared)
        acc += lp + g[0]
    return acc


def time_calls(call: Callable[[int], None], n: int, repeats: int) -> tuple[float, float]:
    """min over repeats of (wall, thread CPU) seconds per call."""
    best_wall = best_cpu = math.inf
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.thread_time()
        call(n)
        w1, c1 = time.perf_counter(), time.thread_time()
        best_wall = min(best_wall, (w1 - w0) / n)
        best_cpu = min(best_cpu, (c1 - c0) / n)
    return best_wall * 1e6, best_cpu * 1e6


def direct(form: str, args, theta_points, n=2000, repeats=15, base=None):
    model = FORMS[form](*args)
    t0 = time.perf_counter()
    n_dim, fn_pt, shared, shape_info = nutpie_logp_function(model)
    jit = fn_pt.vm.jit_fn
    x = theta_points[0].copy()
    _sum_calls(jit, 1, x, shared)  # compile
    compile_s = time.perf_counter() - t0
    values = [jit(t.copy(), *shared) for t in theta_points]
    err = None
    if base is not None:
        err = max(
            max(abs(v[0] - b[0]) / abs(b[0]), float(np.max(np.abs(v[1] - b[1])) / np.max(np.abs(b[1]))))
            for v, b in zip(values, base, strict=True)
        )
    wall, cpu = time_calls(lambda k: _sum_calls(jit, k, x, shared), n, repeats)
    return {"form": form, "us_wall": round(wall, 1), "us_cpu": round(cpu, 1), "rel_err": err,
            "compile_s": round(compile_s, 1), "names": shape_info[0][:n_dim and 9]}, values


def floor_timing(pad, hidden, n=2000, repeats=15):
    floor = numpy_floor.NumpyFloor(pad.X, pad.y, pad.valid, hidden)
    theta = np.random.default_rng(0).normal(scale=0.5, size=floor.n_dim)
    floor.logp_and_grad(theta)

    def call(k):
        for _ in range(k):
            floor.logp_and_grad(theta)

    wall, cpu = time_calls(call, n, repeats)
    return {"form": "numpy_floor", "us_wall": round(wall, 1), "us_cpu": round(cpu, 1)}


def interleaved(forms, args, pad, points, n=500, rounds=40):
    """Compile every form first, then time them round-robin (same load for all); min per form."""
    runners = {}
    _, base = direct("baseline", args, points, n=10, repeats=1)
    for form in forms:
        # "<form>@nofastmath" compiles <form> with pytensor's numba fastmath flag off
        name, _, flag = form.partition("@")
        model = FORMS[name](*args)
        pytensor.config.numba__fastmath = flag != "nofastmath"
        try:
            _, fn_pt, shared, _ = nutpie_logp_function(model)
        finally:
            pytensor.config.numba__fastmath = True
        jit = fn_pt.vm.jit_fn
        x = points[0].copy()
        _sum_calls(jit, 1, x, shared)
        v = jit(points[1].copy(), *shared)
        err = max(abs(v[0] - base[1][0]) / abs(base[1][0]), float(np.max(np.abs(v[1] - base[1][1]))))
        runners[form] = (lambda k, jit=jit, x=x, shared=shared: _sum_calls(jit, k, x, shared), err)
    floor = numpy_floor.NumpyFloor(pad.X, pad.y, pad.valid, args[-1])
    theta = points[0].copy()

    def floor_call(k):
        for _ in range(k):
            floor.logp_and_grad(theta)

    runners["numpy_floor"] = (floor_call, 0.0)
    best = {f: [math.inf, math.inf] for f in runners}
    for _ in range(rounds):
        for form, (call, _) in runners.items():
            wall, cpu = time_calls(call, n, 1)
            best[form][0] = min(best[form][0], wall)
            best[form][1] = min(best[form][1], cpu)
    return [{"form": f, "us_wall": round(b[0], 1), "us_cpu": round(b[1], 1), "err_vs_baseline": runners[f][1]}
            for f, b in best.items()]


def sample_timing(form, args, draws=400, tune=400, seed=3):
    import nutpie

    model = FORMS[form](*args)
    t0 = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, backend="numba")
    compile_s = time.perf_counter() - t0
    best = None
    for rep in range(2):
        c0 = time.process_time()
        t0 = time.perf_counter()
        idata = nutpie.sample(compiled, draws=draws, tune=tune, chains=1, cores=1, seed=seed,
                              progress_bar=False, save_warmup=True, target_accept=0.9)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        steps = int(idata.warmup_sample_stats["n_steps"].sum() + idata.sample_stats["n_steps"].sum())
        res = {"rep": rep, "wall_s": round(wall, 2), "steps": steps, "us_wall_per_step": round(wall / steps * 1e6, 1),
               "us_cpu_per_step": round(cpu / steps * 1e6, 1)}
        if best is None or res["us_wall_per_step"] < best["us_wall_per_step"]:
            best = res
    return {"form": form, "sample": best, "compile_s": round(compile_s, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("forms", nargs="*", default=list(FORMS))
    parser.add_argument("--sample", action="store_true", help="also time nutpie sampling")
    parser.add_argument("--no-direct", action="store_true")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--fastmath", choices=["on", "off"], default=None)
    parser.add_argument("--floor", action="store_true", help="also time the NumPy floor")
    parser.add_argument("--interleave", action="store_true", help="compile all, then time round-robin")
    parser.add_argument("--rounds", type=int, default=40)
    opts = parser.parse_args(argv)
    if opts.fastmath is not None:
        pytensor.config.numba__fastmath = opts.fastmath == "on"
    args, pad = default_data()
    rng = np.random.default_rng(11)
    base_model = FORMS["baseline"](*args)
    n_dim = sum(int(np.prod(v.shape)) for v in base_model.initial_point().values())
    points = [rng.normal(scale=s, size=n_dim) for s in (0.3, 1.0)]
    base = None
    if opts.interleave:
        for row in interleaved(opts.forms, args, pad, points, opts.n, opts.rounds):
            print(json.dumps(row), flush=True)
        return
    if not opts.no_direct:
        _, base = direct("baseline", args, points, n=10, repeats=1)
    if opts.floor:
        print(json.dumps(floor_timing(pad, args[-1], opts.n, opts.repeats)), flush=True)
    for form in opts.forms:
        if not opts.no_direct:
            try:
                res, _ = direct(form, args, points, opts.n, opts.repeats, base)
                res.pop("names")
                res["fastmath"] = bool(pytensor.config.numba__fastmath)
            except Exception as err:  # report and go on
                res = {"form": form, "error": f"{type(err).__name__}: {err}"[:300]}
            print(json.dumps(res), flush=True)
        if opts.sample:
            print(json.dumps(sample_timing(form, args)), flush=True)


if __name__ == "__main__":
    main()
