"""The hand-written hierarchical log density is PyMC's, value and gradient, for every model the builder makes."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys

import numpy as np
import pymc as pm
import pytest

from hbnn.density import buffer, callbacks, densities, kernel, modules, numerics, pymc_check
from hbnn.model.builders import build_flat_model, build_hierarchical_model, build_informed_model
from hbnn.model.network import layer_specs
from hbnn.sampling.nutpie_adapter import compile_numba


def _data(likelihood: str, counts=(7, 3, 12), n_features: int = 2, seed: int = 0):
    """Padded rows of ``len(counts)`` groups (each group's real rows first) with labels fit for ``likelihood``."""
    rng = np.random.default_rng(seed)
    width = max(counts)
    X = np.zeros((len(counts), width, n_features))
    valid, y = [], []
    for g, n in enumerate(counts):
        X[g, :n] = rng.normal(size=(n, n_features))
        valid.append(g * width + np.arange(n))
        if likelihood == "bernoulli":
            y.append(np.arange(n) % 2)
        elif likelihood == "poisson":
            y.append(rng.poisson(2.0, n))
        elif likelihood == "negative_binomial":  # overdispersed, with counts past 64 (the digamma branch) too
            y.append(rng.negative_binomial(1.0, 0.03, n))
        else:
            y.append(rng.normal(size=n))
    return X, np.concatenate(y).astype(float), np.asarray(counts), np.concatenate(valid)


def _value_layout(model) -> tuple[dict[str, int], int]:
    offsets, at = {}, 0
    for name, value in model.initial_point().items():
        offsets[name] = at
        at += int(np.size(value))
    return offsets, at


CASES = [
    ("bernoulli", (5, 5), False, (7, 3, 12)),
    ("bernoulli", (4,), True, (7, 3, 12)),
    ("bernoulli", (), False, (6, 6, 6)),
    ("bernoulli", (3, 4, 2), True, (6, 6, 6)),
    ("gaussian", (5, 5), False, (7, 3, 12)),
    ("gaussian", (3,), True, (5, 9, 2)),
    ("poisson", (5, 5), False, (7, 3, 12)),
    ("poisson", (2, 3), True, (4, 4, 8)),
    ("negative_binomial", (5, 5), False, (7, 3, 12)),
    ("negative_binomial", (2, 3), True, (4, 4, 8)),
]


@pytest.mark.parametrize("likelihood, hidden, bias, counts", CASES)
def test_log_density_and_gradient_equal_pymcs(likelihood, hidden, bias, counts):
    X, y, counts, valid = _data(likelihood, counts, n_features=3 if bias else 2)
    groups = [f"g{i}" for i in range(len(counts))]
    features = [f"x{i}" for i in range(X.shape[2])]
    noise_sd = 0.7
    model = build_hierarchical_model(X, y, valid, groups, features, hidden, likelihood=likelihood,
                                     noise_sd=noise_sd, bias=bias)
    density = densities.HierarchicalDensity(X, y, counts, hidden, bias, likelihood, noise_sd)
    _assert_same_density(model, density)


def _assert_same_density(model, density):
    offsets, n_dim = _value_layout(model)
    assert [v.name for v in model.value_vars] == list(offsets)  # the flat order is model.value_vars'
    assert {n: np.shape(v) for n, v in model.initial_point().items()} == density.names()
    buf = density.pack(offsets)
    pymc = model.logp_dlogp_function(ravel_inputs=True)
    pymc.set_extra_values({})
    written_out = density.logp_grad()  # the network's passes written out (hbnn.density.written), as every fit
    from hbnn.density import written

    generic = written.logp_grad_for(*density._network(), density.likelihood, density.activation, generic=True)
    assert written_out is not generic
    rng = np.random.default_rng(1)
    for scale in (0.0, 0.5, 1.5, 4.0):  # 4.0: saturated tanh units, large logits and rates
        theta = rng.normal(0.0, scale, n_dim)
        want, want_grad = pymc(theta)
        # The passes over rows run in float32 (numerics.ROW_DTYPE): equal to pymc_check.ROW_RTOL of the scale. At 4.0 a
        # Poisson log density reaches -1e9 (rates up to e^20), where the float32 sums of the gradient lose more.
        counts = density.likelihood in ("poisson", "negative_binomial")
        grad_rtol = 1e-2 if scale == 4.0 and counts else pymc_check.ROW_RTOL
        for fn in (generic, written_out):
            grad = np.full(n_dim, np.nan)
            got = fn(theta, grad, buf)
            assert abs(got - want) <= pymc_check.ROW_RTOL * max(1.0, abs(want))
            assert np.abs(grad - want_grad).max() <= grad_rtol * max(1.0, np.abs(want_grad).max())


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("likelihood, hidden, bias, counts", [CASES[0], CASES[5], ("poisson", (2,), False, (17, 3, 9))])
def test_rows_padded_to_either_vector_width_give_pymcs_density(monkeypatch, lanes, likelihood, hidden, bias, counts):
    """The kernel pads each group's rows to whole vectors of the width numba compiles on the machine (8 or 16
    float32 rows, :func:`hbnn.density.buffer.row_lanes`); both paddings compute PyMC's density, whichever this
    machine has."""
    monkeypatch.setattr(buffer, "row_lanes", lambda: lanes)
    X, y, counts, valid = _data(likelihood, counts, n_features=3 if bias else 2)
    model = build_hierarchical_model(X, y, valid, [f"g{i}" for i in range(len(counts))],
                                     [f"x{i}" for i in range(X.shape[2])], hidden, likelihood=likelihood,
                                     noise_sd=0.7, bias=bias)
    density = densities.HierarchicalDensity(X, y, counts, hidden, bias, likelihood, 0.7)
    buf = density.pack(density.offsets())
    assert int(buf[3]) % lanes == 0 and int(buf[3]) >= max(counts) and int(buf[14]) == lanes
    _assert_same_density(model, density)


def test_the_row_lanes_are_what_numba_compiles_here_and_kept_for_later_processes(fresh_kernel_cache):
    import numba

    lanes = buffer.row_lanes.__wrapped__()
    signature = (numba.float32, numba.float32[::1], numba.float32[::1], numba.int64)
    asm = numba.njit(signature, fastmath=True)(buffer._axpy).inspect_asm(signature)
    assert lanes == (16 if "zmm" in asm else 8)
    (kept,) = fresh_kernel_cache.glob("row_lanes_*")
    assert kept.read_text() == str(lanes)
    other = 24 - lanes
    kept.write_text(str(other))  # what a later process reads instead of compiling the probe again
    assert buffer.row_lanes.__wrapped__() == other
    for damaged in ("4", "sixteen", ""):  # ... and where it reads no width, it probes again and writes it afresh
        kept.write_text(damaged)
        assert buffer.row_lanes.__wrapped__() == lanes and kept.read_text() == str(lanes)


def test_networks_past_the_written_out_size_get_a_module_of_the_generic_loops():
    from hbnn.density import written as kernel_unrolled

    top = kernel_unrolled.MAX_WEIGHTS  # a linear model on `top` features has `top` weights
    generic = modules.function_source(kernel.SOURCE, "_forward")
    assert generic not in kernel_unrolled.module_source(top, (), False, "bernoulli", "tanh")
    for network in ((top + 1, (), False), (top, (), True), (2, (top,), False)):  # the bias makes the 2nd top + 1
        source = kernel_unrolled.module_source(*network, "bernoulli", "tanh")
        assert all(modules.function_source(kernel.SOURCE, name) in source for name in kernel_unrolled.GENERIC)
    fn = kernel_unrolled.logp_grad_for(2, (top,), False, "bernoulli", "tanh")
    assert fn.py_func.__module__.startswith("hbnn_kernel_")


def test_the_written_out_module_is_named_after_all_of_hbnn_kernel():
    """numba's cache checks the written module's time stamp, not what it imports from hbnn.density.kernel,
    callbacks and numerics, so any change to any of them must give the module another file (its name is a hash of its
    source)."""
    import hashlib
    import inspect
    from pathlib import Path

    from hbnn.density import written as kernel_unrolled

    assert kernel.SOURCE == Path(kernel.__file__).read_text()
    source = kernel_unrolled.module_source(2, (3,), False, "bernoulli", "tanh")
    both = kernel.SOURCE + callbacks.SOURCE + Path(numerics.__file__).read_text()
    assert hashlib.sha256(both.encode()).hexdigest() in source
    assert "def _forward(" in source and "def _backward(" in source and "def logp_grad(" in source
    assert "def _group_weights(" in source and "def _group_chain_rule(" in source  # loops of constant length
    for name in ("_output", "_group_loglik", "logp_grad"):  # the kernel's own functions, whole and unchanged
        want = inspect.getsource(getattr(kernel, name).py_func)
        assert modules.function_source(kernel.SOURCE, name).rstrip() == want.rstrip()
        assert want.rstrip() in source


@pytest.fixture
def fresh_density_checks(tmp_path, monkeypatch):
    """A directory of its own for the records of passed density checks (each test then checks afresh)."""
    monkeypatch.setenv("HBNN_DENSITY_CHECKS", str(tmp_path / "checks"))
    return tmp_path / "checks"


@pytest.fixture
def fresh_kernel_cache(tmp_path, monkeypatch):
    from hbnn.density import written as kernel_unrolled

    monkeypatch.setenv("HBNN_KERNEL_CACHE", str(tmp_path / "kernels"))
    kernel_unrolled.logp_grad_for.cache_clear()
    kernel_unrolled.callback_for.cache_clear()
    yield tmp_path / "kernels"
    kernel_unrolled.logp_grad_for.cache_clear()
    kernel_unrolled.callback_for.cache_clear()


def test_threads_loading_one_network_at_once_all_get_the_whole_module(fresh_kernel_cache):
    import threading

    from hbnn.density import written as kernel_unrolled

    hidden = (2, 7)  # a network no other test loads, so its module is new to this process
    start, got, errors = threading.Barrier(4), [], []

    def load():
        start.wait()
        try:
            got.append(kernel_unrolled.logp_grad_for(2, hidden, True, "bernoulli", "tanh"))
        except Exception as err:  # noqa: BLE001 - collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 4
    assert len(set(map(id, got))) == 1
    (written,) = fresh_kernel_cache.glob("hbnn_kernel_*.py")
    assert not list(fresh_kernel_cache.glob("*.tmp"))
    mask = os.umask(0)
    os.umask(mask)
    assert written.stat().st_mode & 0o777 == 0o666 & ~mask  # readable by whoever shares the cache


def test_a_damaged_module_file_is_written_again(fresh_kernel_cache, caplog):
    import hashlib

    from hbnn.density import written as kernel_unrolled

    source = kernel_unrolled.module_source(2, (3, 2), False, "bernoulli", "tanh")
    name = "hbnn_kernel_" + hashlib.sha256(source.encode()).hexdigest()[:20]
    fresh_kernel_cache.mkdir()
    for broken in ("", source[: source.index("def _backward")] + "def _backward(\n"):  # empty; cut mid-line
        (fresh_kernel_cache / f"{name}.py").write_text(broken)
        kernel_unrolled.logp_grad_for.cache_clear()
        sys.modules.pop(name, None)
        caplog.clear()
        assert kernel_unrolled.logp_grad_for(2, (3, 2), False, "bernoulli", "tanh") is not None
        assert "writing it again" in caplog.text
        assert (fresh_kernel_cache / f"{name}.py").read_text() == source


def test_a_module_that_cannot_be_imported_from_any_folder_is_compiled_in_memory(fresh_kernel_cache, caplog,
                                                                               monkeypatch):
    """Never the generic loops in its place (other float32 sums, so other draws): the same source, in memory."""
    from hbnn.density import written as kernel_unrolled

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(1, 20, 2)), (rng.random(20) < 0.5) * 1.0
    density = densities.FlatDensity(X, y, np.array([20]), (3, 2), False, "bernoulli", 1.0)
    buf = density.pack(density.offsets())
    theta = rng.normal(size=sum(int(np.prod(s)) for s in density.names().values()))

    def evaluate(fn):
        grad = np.empty_like(theta)
        return fn(theta, grad, buf), grad

    want = evaluate(kernel_unrolled.logp_grad_for(2, (3, 2), False, "bernoulli", "tanh"))
    name = kernel_unrolled._network_module(2, (3, 2), False, "bernoulli", "tanh")[0]
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(modules, "_import_at", lambda *args: (_ for _ in ()).throw(OSError("no folder")))
    kernel_unrolled.logp_grad_for.cache_clear()
    fn = kernel_unrolled.logp_grad_for(2, (3, 2), False, "bernoulli", "tanh")
    assert "compiled in memory, without a cache" in caplog.text
    assert fn.py_func.__module__ == name
    got = evaluate(fn)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])


_CALL_ONE = """
import ctypes, hashlib, logging, numpy as np
logging.basicConfig(level=logging.WARNING)
from hbnn.density import callbacks, densities
rng = np.random.default_rng(0)
X, y = rng.normal(size=(1, 20, 2)), (rng.random(20) < 0.5) * 1.0
density = densities.FlatDensity(X, y, np.array([20]), (5, 5), False, "bernoulli", 1.0)
buf = density.pack({"w_in": 0, "w_h1_h2": 10, "w_out": 35})
theta = rng.normal(size=40)
P = ctypes.POINTER(ctypes.c_double)
cb = density.callback(0)
grad, value = np.empty(40), np.empty(1)
cb.ctypes(40, theta.ctypes.data_as(P), grad.ctypes.data_as(P), value.ctypes.data_as(P), buf.ctypes.data)
print(hashlib.sha256(grad.tobytes() + value.tobytes()).hexdigest(), "loaded" if cb.cache_hits else "compiled")
"""


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 3]))
    else:  # 4 KiB of flipped bits in the middle
        middle = len(data) // 2
        data[middle: middle + 4096] = bytes(b ^ 0xFF for b in data[middle: middle + 4096])
        path.write_bytes(bytes(data))


def test_damaged_cache_entries_are_compiled_again_and_give_the_same_bits(tmp_path):
    """A truncated index or a data file with flipped bits in the shared kernel cache (as a full disk, a crash or a
    bad copy leaves them) is removed before numba could load it, and compiled again: the same bits as a clean
    cache, a warning, no error. A cache folder that cannot be used compiles the same source elsewhere."""
    import subprocess

    kernels = tmp_path / "kernels"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), HBNN_KERNEL_CACHE=str(kernels))

    def run(**extra):
        done = subprocess.run([sys.executable, "-c", _CALL_ONE], env={**env, **extra}, capture_output=True,
                              text=True)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return done.stdout.split(), done.stderr

    (clean, how), _ = run()
    assert how == "compiled"
    assert run()[0] == [clean, "loaded"]
    entries = sorted((kernels / "__pycache__").glob("hbnn_*.nb?"))
    assert {p.suffix for p in entries} == {".nbi", ".nbc"} and list((kernels / "__pycache__").glob("hbnn-manifest-*"))
    for damage in ("truncate", "flip"):
        for path in entries:
            _damage(path, damage)
        got, log = run()
        assert got == [clean, "compiled"] and "not as written" in log, log
        entries = sorted((kernels / "__pycache__").glob("hbnn_*.nb?"))
        assert run()[0] == [clean, "loaded"]  # ... and written afresh for the next process
    blocker = tmp_path / "file"
    blocker.write_text("")
    got, log = run(HBNN_KERNEL_CACHE=str(blocker / "kernels"))  # under a file: the folder cannot be made
    assert got == [clean, "compiled"] and "compiled in a folder of this process" in log


PER_GROUP_CASES = [
    ("bernoulli", (5, 5), False, 50),
    ("bernoulli", (), True, 7),
    ("gaussian", (3, 4), True, 11),
    ("poisson", (5,), False, 9),
]


@pytest.mark.parametrize("likelihood, hidden, bias, rows", PER_GROUP_CASES)
@pytest.mark.parametrize("which", ["flat", "informed"])
def test_per_group_log_densities_equal_pymcs(which, likelihood, hidden, bias, rows):
    X, y, counts, _ = _data(likelihood, (rows,), n_features=3 if bias else 2, seed=4)
    x = X[0]
    features = [f"x{i}" for i in range(x.shape[1])]
    noise_sd, prior_sd = 0.7, 1.3
    rng = np.random.default_rng(5)
    if which == "flat":
        model = build_flat_model(x, y, features, hidden, prior_sd, likelihood=likelihood, noise_sd=noise_sd,
                                 bias=bias)
        template = densities.FlatDensity(X, y, counts, hidden, bias, likelihood, noise_sd, prior_sd=prior_sd)
    else:
        prior = {}
        for s in layer_specs(x.shape[1], hidden, bias):
            a = rng.normal(size=(s.size, s.size))
            prior[s.name] = (rng.normal(size=s.size), a @ a.T / s.size + 0.1 * np.eye(s.size))
        model = build_informed_model(x, y, features, hidden, prior, likelihood=likelihood, noise_sd=noise_sd,
                                     bias=bias)
        template = densities.InformedDensity(X, y, counts, hidden, bias, likelihood, noise_sd, prior=prior)
    _assert_same_density(model, template)
    # another group's rows, as the per-group fits refit them
    x2, y2 = rng.normal(size=(rows + 3, x.shape[1])), _data(likelihood, (rows + 3,), seed=6)[1]
    with model:
        pm.set_data({"x": x2, "y": y2})
    _assert_same_density(model, template.with_rows(x2, y2))


def test_tanh_and_exp_are_accurate_over_the_whole_range():
    """float32 (numerics.ROW_DTYPE), against float64's exact values at the same float32 inputs."""
    a = np.concatenate([np.linspace(-25, 25, 20001), [0.0, -0.0, 1e-30, -1e-12, 9.0, -9.0, 19.0, -19.0, 3e38,
                                                       -3e38]]).astype(np.float32)
    out = a.copy()
    numerics._tanh_inplace(out, out.size)
    assert out.dtype == np.float32
    exact = np.tanh(a.astype(np.float64))
    # measured 2.4e-7 here (the saturated tails; 2.9e-7 over every float32 in (0, 9.06] where numba fuses
    # multiply-adds, 3.4e-7 evaluated without fused ones); float32's spacing just below 1: 6e-8
    assert np.abs(out - exact).max() <= 3.5e-7
    assert np.abs(out).max() <= 1.0 and np.array_equal(out[:20001], -out[20000::-1])  # bounded and odd
    small = np.abs(a) < 1e-3  # near 0, relative: measured 2.7e-7
    assert np.all(np.abs(out[small] - exact[small]) <= 3e-7 * np.abs(exact[small]))
    # 3.0e-7 relative at most, measured (float32's relative spacing: 6e-8 to 1.2e-7)
    for top, rtol in ((1.0, 4e-7), (40.0, 4e-7), (87.0, 4e-7)):
        x = (-np.linspace(0.0, top, 7001)).astype(np.float32)
        e = np.empty_like(x)
        numerics._exp_nonpositive(x, e, x.size, np.empty(x.size, dtype=np.int32))
        np.testing.assert_allclose(e, np.exp(x.astype(np.float64)), rtol=rtol, atol=0)
    # below -87, exp(-87): never a wrapped exponent (0, inf or 4e33 without the clamp)
    x = np.array([-87.0, -88.0, -89.0, -100.0, -1e30, -np.inf], dtype=np.float32)
    e = np.empty_like(x)
    numerics._exp_nonpositive(x, e, x.size, np.empty(x.size, dtype=np.int32))
    np.testing.assert_allclose(e, np.exp(-87.0), rtol=4e-7)


def test_tanh_and_exp_loops_convert_no_float_to_an_integer():
    """``exp``'s ``2**k`` is built from float bits, never by a float-to-int64 conversion, which x86-64 vectorises
    only with AVX-512: with AVX2 alone every value went through a scalar ``cvttsd2si`` (1.8x the time of a tanh)."""
    import numba

    @numba.njit(fastmath=True, error_model="numpy")
    def both(a, e, bits):
        numerics._tanh_inplace(a, a.size)
        numerics._exp_nonpositive(a, e, a.size, bits)

    a = np.linspace(-3.0, 0.0, 64).astype(numerics.ROW_DTYPE)
    both(a, np.empty(64, numerics.ROW_DTYPE), np.empty(64, dtype=np.int32))
    (asm,) = both.inspect_asm().values()
    assert not any(op in asm for op in ("cvttsd2si", "cvtsd2si", "cvttss2si", "cvtss2si"))


def test_the_passes_over_rows_run_in_float32_vectors():
    """A float64 constant or array in the row loops turns them into float64 (half the rows per vector, ~1.7x
    the time). The written-out kernel's vector arithmetic is mostly float32 (429 instructions against 112 in
    float64 vectors, which are the priors' loops over the sampler's coordinates, on an AVX-512 machine; 441
    against 335 where LLVM unrolls the float64 loops further for 256-bit vectors); with float64 passes nearly
    all of it was float64."""
    import re

    import numba

    density = densities.HierarchicalDensity(*_data("bernoulli")[:3], (5, 5), False, "bernoulli", 1.0)
    # The written-out function compiled here: loaded from numba's cache (or a module imported before), it has no IR.
    fn = numba.njit(fastmath=True, error_model="numpy")(density.logp_grad().py_func)
    n = sum(int(np.prod(s)) for s in density.names().values())
    fn(np.zeros(n), np.empty(n), density.pack(density.offsets()))
    (ir,) = fn.inspect_llvm().values()
    f32 = len(re.findall(r"= f(?:mul|add|sub|div) fast <(?:8|16) x float>", ir))
    f64 = len(re.findall(r"= f(?:mul|add|sub|div) fast <(?:4|8) x double>", ir))
    assert f32 > f64 > 0
    # the rows are padded to the vectors this kernel is compiled to: 16 rows where its float32 arithmetic runs in
    # 512-bit registers (on some CPUs only integer address arithmetic does, and float32 takes 256-bit ones)
    (asm,) = fn.inspect_asm().values()
    wide = re.search(r"^\s*v(?:fmadd\w*|mul|add|sub)ps\s.*zmm", asm, re.MULTILINE)
    assert buffer.row_lanes() == (16 if wide else 8)


def test_nutpie_samples_the_hand_written_density_after_checking_it(tiny_tasks, caplog, fresh_density_checks):
    import nutpie

    from hbnn.config import SamplerParams
    from hbnn.sampling.sampler import Sampler

    pad = tiny_tasks.padded("train")
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tiny_tasks.group_names, tiny_tasks.features, (3,))
    density = densities.HierarchicalDensity(pad.X, pad.y, pad.counts, (3,), False, "bernoulli", 1.0,
                                         features=tuple(tiny_tasks.features), groups=tuple(tiny_tasks.group_names))
    compiled = compile_numba(model)
    density.check(compiled)
    ours = density.nutpie_model()  # built without PyTensor
    # the callback, called as nutpie calls it (pointers), gives PyMC's value and gradient
    theta = np.random.default_rng(2).normal(0.0, 0.8, compiled.n_dim)
    grad, value = np.empty(compiled.n_dim), np.empty(1)
    pointers = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in (theta, grad, value)]
    status = ours.compiled_logp_func.ctypes(compiled.n_dim, *pointers, ours.user_data.ctypes.data)
    want, want_grad = compiled.logp_func(theta)
    assert status == 0
    assert abs(value[0] - want) <= pymc_check.ROW_RTOL * max(1.0, abs(want))  # float32 passes over rows
    assert np.abs(grad - want_grad).max() <= pymc_check.ROW_RTOL * max(1.0, np.abs(want_grad).max())
    wrong_size = ours.compiled_logp_func.ctypes(compiled.n_dim + 1, *pointers, ours.user_data.ctypes.data)
    assert wrong_size == -1  # a vector of the wrong size is refused
    # the expanded draw: PyTensor's, variable for variable (sds on their own scale, w = mu + sd * z)
    np.testing.assert_allclose(pymc_check.call_expand(ours, theta), pymc_check.call_expand(compiled, theta), rtol=1e-13,
                               atol=1e-14)
    # it samples, with PyTensor's variables, dims and coordinates, the same draws for the same seed
    kwargs = dict(draws=30, tune=30, chains=2, cores=1, seed=5, progress_bar=False)
    mine, theirs = nutpie.sample(ours, **kwargs).posterior, nutpie.sample(compiled, **kwargs).posterior
    assert list(mine.data_vars) == list(theirs.data_vars) and np.isfinite(mine["w_out"].values).all()
    for name in mine.data_vars:
        assert mine[name].dims == theirs[name].dims
    for dim in mine.dims:
        np.testing.assert_array_equal(mine[dim].values, theirs[dim].values)
    np.testing.assert_array_equal(nutpie.sample(ours, **kwargs).posterior["w_out"].values, mine["w_out"].values)
    # a model it does not compute, or a density that is not the model's, is refused before sampling
    with pytest.raises(ValueError, match="not the model this log density computes"):
        dataclasses.replace(density, hidden_layers=(4,)).check(compiled)
    with pytest.raises(ValueError, match="disagrees with PyMC"):
        dataclasses.replace(density, noise_sd=2.0, likelihood="poisson").check(compiled)
    with pytest.raises(pymc_check.DensityMismatch, match="dims and coordinates would differ"):
        dataclasses.replace(density, groups=tuple(reversed(density.groups))).check(compiled)
    # the sampler then keeps PyTensor's density, with a warning: the same draws as without a density
    settings = SamplerParams(tune=20, draws=10, cores=1)
    refused = Sampler(model, settings, dataclasses.replace(density, hidden_layers=(4,)))
    assert refused.backend.density is None and "sampling PyTensor's log density" in caplog.text
    plain = Sampler(model, settings)
    np.testing.assert_array_equal(refused.sample(4, watch=False).posterior.posterior["w_out"].values,
                                  plain.sample(4, watch=False).posterior.posterior["w_out"].values)


def test_a_checked_density_samples_without_pymc_afterwards(tiny_tasks, fresh_density_checks, caplog):
    """The first sampler of a density builds PyMC's model and checks the density against it; later ones (other
    processes: the record is a file) neither build nor compile it, and sample the same draws."""
    from hbnn.config import SamplerParams
    from hbnn.sampling.sampler import Sampler

    caplog.set_level("DEBUG", logger=pymc_check.log.name)
    pad = tiny_tasks.padded("train")
    built = []

    def model():
        built.append(1)
        return build_hierarchical_model(pad.X, pad.y, pad.valid, tiny_tasks.group_names, tiny_tasks.features, (3,))

    density = densities.HierarchicalDensity(pad.X, pad.y, pad.counts, (3,), False, "bernoulli", 1.0,
                                         features=tuple(tiny_tasks.features), groups=tuple(tiny_tasks.group_names))
    settings = SamplerParams(tune=20, draws=10, cores=1)
    first = Sampler(model, settings, density)
    assert built == [1] and "checking the hand-written HierarchicalDensity" in caplog.text
    assert (fresh_density_checks / density.check_key()).exists()
    later = Sampler(model, settings, density)
    assert built == [1] and later.backend.density is density  # checked before: no PyMC model
    np.testing.assert_array_equal(first.sample(4, watch=False).posterior.posterior["w_out"].values,
                                  later.sample(4, watch=False).posterior.posterior["w_out"].values)
    # what the check depends on is in its key; the data's values are not
    assert dataclasses.replace(density, y=1.0 - density.y).check_key() == density.check_key()
    for other in (dataclasses.replace(density, hidden_layers=(4,)), dataclasses.replace(density, noise_sd=2.0),
                  dataclasses.replace(density, counts=np.arange(density.counts.size) + 1),
                  dataclasses.replace(density, groups=density.groups[::-1])):
        assert other.check_key() != density.check_key()


@pytest.mark.parametrize("which, likelihood, hidden, bias", [
    ("hierarchical", "gaussian", (3,), True), ("hierarchical", "poisson", (2, 3), False),
    ("flat", "gaussian", (2, 3), True), ("informed", "gaussian", (3,), True), ("informed", "poisson", (), False),
    ("flat", "negative_binomial", (3,), False), ("hierarchical", "negative_binomial", (2,), True)])
def test_the_nutpie_model_built_from_a_density_is_nutpies_compile_of_pymcs(which, likelihood, hidden, bias):
    """Variables in PyMC's order (log-transformed ones, then sigma, then the weights' deterministics), dims,
    coordinates, value, gradient and expanded draws: the check passes for every kind and the transformed
    variables each adds."""
    X, y, counts, valid = _data(likelihood, (7, 3, 12) if which == "hierarchical" else (9,),
                                n_features=3 if bias else 2, seed=3)
    features = [f"f{i}" for i in range(X.shape[2])]
    if which == "hierarchical":
        groups = ["a", "b", "c"]
        model = build_hierarchical_model(X, y, valid, groups, features, hidden, likelihood=likelihood, noise_sd=0.7,
                                         bias=bias)
        density = densities.HierarchicalDensity(X, y, counts, hidden, bias, likelihood, 0.7, features=tuple(features),
                                             groups=tuple(groups))
    elif which == "flat":
        model = build_flat_model(X[0], y, features, hidden, 1.3, likelihood=likelihood, noise_sd=0.7, bias=bias)
        density = densities.FlatDensity.on_rows(X[0], y, hidden, bias, likelihood, 0.7, prior_sd=1.3,
                                             features=tuple(features))
    else:
        rng = np.random.default_rng(4)
        prior = {}
        for s in layer_specs(X.shape[2], hidden, bias):
            a = rng.normal(size=(s.size, s.size))
            prior[s.name] = (rng.normal(size=s.size), a @ a.T / s.size + 0.1 * np.eye(s.size))
        model = build_informed_model(X[0], y, features, hidden, prior, likelihood=likelihood, noise_sd=0.7,
                                     bias=bias)
        density = densities.InformedDensity.on_rows(X[0], y, hidden, bias, likelihood, 0.7, prior=prior,
                                                 features=tuple(features))
    compiled = compile_numba(model)
    density.check(compiled)
    ours = density.nutpie_model()
    assert ours.dims == {name: dims for name, dims in compiled.dims.items() if name in ours.dims}
    assert set(ours.dims) == {name for name in compiled.shape_info[0] if name in compiled.dims}
    for dim, values in ours.coords.items():
        assert list(values) == list(compiled.coords[dim]), dim
    # a chain starts where PyMC starts it: the prior's support point plus U(-1, 1) jitter
    starts = np.array([ours.initial_point_func(seed) for seed in range(200)])
    center = density.initial_center()
    assert np.all(np.abs(starts - center) <= 1.0) and np.abs((starts - center).mean()) < 0.1
    pymc_start = compiled.initial_point_func(0)
    assert pymc_start.shape == starts[0].shape and np.all(np.abs(pymc_start - center) <= 1.0)


def test_informed_fits_expand_every_draw_on_the_prior_and_refit_other_rows(fresh_density_checks):
    """Every draw's weights are ``mean + L @ z`` (the prior sits in the density's buffer), on the first group's
    rows and after a refit on other rows, which samples what a model built on those rows samples."""
    from hbnn.config import SamplerParams
    from hbnn.sampling.sampler import Sampler

    X, y, _, _ = _data("bernoulli", (9,), seed=7)
    model, density, prior = _informed(X[0], y, seed=8)
    sampler = Sampler(model, SamplerParams(tune=30, draws=10, cores=1), density)
    assert sampler.backend.density is density  # the hand-written density is the one sampled
    x2, y2 = np.random.default_rng(9).normal(size=(14, 2)), np.arange(14) % 2 * 1.0
    for data in (None, {"x": x2, "y": y2}):
        post = sampler.sample(3, data, watch=False).posterior.posterior
        for s in layer_specs(2, (3,), False):
            mean, cov = prior[s.name]
            want = mean + np.einsum("ij,cdj->cdi", np.linalg.cholesky(cov), post[f"z_{s.name}"].values)
            np.testing.assert_allclose(post[s.var].values.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    rebuilt = Sampler(_informed(x2, y2, seed=8)[0], SamplerParams(tune=30, draws=10, cores=1),
                                density.with_rows(x2, y2))
    refit = sampler.sample(3, {"x": x2, "y": y2}, watch=False).posterior.posterior
    np.testing.assert_array_equal(rebuilt.sample(3, watch=False).posterior.posterior["w_out"].values,
                                  refit["w_out"].values)
    # a new prior of the same shapes is the same check: its values are data
    assert _informed(X[0], y, seed=10)[1].check_key() == density.check_key()


def _informed(x, y, seed: int, hidden=(3,), bias=False, activation="tanh"):
    rng = np.random.default_rng(seed)
    prior = {}
    for s in layer_specs(x.shape[1], hidden, bias):
        a = rng.normal(size=(s.size, s.size))
        prior[s.name] = (rng.normal(size=s.size), a @ a.T / s.size + 0.1 * np.eye(s.size))
    features = [f"x{i}" for i in range(x.shape[1])]
    model = build_informed_model(x, y, features, hidden, prior, bias=bias, activation=activation)
    return model, densities.InformedDensity.on_rows(x, y, hidden, bias, "bernoulli", 1.0, prior=prior,
                                                    features=tuple(features), activation=activation), prior


_DRAW_ONE = """
import ctypes, hashlib, numpy as np
from hbnn.density import callbacks, densities
rng = np.random.default_rng(0)
X, y = rng.normal(size=(1, 20, 2)), (rng.random(20) < 0.5) * 1.0
density = densities.FlatDensity(X, y, np.array([20]), (5, 5), False, "bernoulli", 1.0)
buf = density.pack({"w_in": 0, "w_h1_h2": 10, "w_out": 35})
theta = rng.normal(size=40)
P = ctypes.POINTER(ctypes.c_double)
cached, compiled = density.callback(0), callbacks.callback(0, density.logp_grad())
for cb in (cached, compiled):
    grad, value = np.empty(40), np.empty(1)
    cb.ctypes(40, theta.ctypes.data_as(P), grad.ctypes.data_as(P), value.ctypes.data_as(P), buf.ctypes.data)
    print(hashlib.sha256(grad.tobytes() + value.tobytes()).hexdigest())
print("loaded" if cached.cache_hits else "compiled")
"""


def test_the_callback_computes_the_same_bits_whether_numba_compiled_it_or_loaded_it(tmp_path):
    """A stage process that compiles the kernel and nutpie's callback and the next ones, which load both from
    numba's disk cache, sample the same draws: the callback's bits do not depend on the cache, and are those of
    the same callback compiled in the process (:func:`hbnn.density.callbacks.callback`)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), HBNN_KERNEL_CACHE=str(tmp_path / "kernels"))
    runs = [subprocess.run([sys.executable, "-c", _DRAW_ONE], env=env, capture_output=True, text=True, check=True)
            for _ in range(3)]
    assert len(list((tmp_path / "kernels").glob("hbnn_kernel_*.py"))) == 1  # the written-out passes
    assert len(list((tmp_path / "kernels").glob("hbnn_callback_*.py"))) == 1  # and the callback around them
    lines = [r.stdout.split() for r in runs]
    assert [line[2] for line in lines] == ["compiled", "loaded", "loaded"]  # the first run wrote what the others read
    assert len({h for line in lines for h in line[:2]}) == 1, lines


@pytest.mark.parametrize("which, likelihood, hidden, bias", [
    ("hierarchical", "bernoulli", (5, 5), False), ("hierarchical", "gaussian", (3,), True),
    ("flat", "poisson", (4, 3), True), ("informed", "bernoulli", (3,), False)])
def test_relu_networks_log_density_and_gradient_equal_pymcs(which, likelihood, hidden, bias):
    """relu's compiled code (its slope from the unit's output) in every kind of density."""
    X, y, counts, valid = _data(likelihood, (7, 3, 12) if which == "hierarchical" else (11,),
                                n_features=3 if bias else 2, seed=5)
    features = [f"f{i}" for i in range(X.shape[2])]
    if which == "hierarchical":
        groups = ["a", "b", "c"]
        model = build_hierarchical_model(X, y, valid, groups, features, hidden, likelihood=likelihood, noise_sd=0.7,
                                         bias=bias, activation="relu")
        density = densities.HierarchicalDensity(X, y, counts, hidden, bias, likelihood, 0.7, activation="relu")
    elif which == "flat":
        model = build_flat_model(X[0], y, features, hidden, 1.3, likelihood=likelihood, bias=bias, activation="relu")
        density = densities.FlatDensity.on_rows(X[0], y, hidden, bias, likelihood, 1.0, prior_sd=1.3,
                                                features=tuple(features), activation="relu")
    else:
        model, density, _ = _informed(X[0], y, seed=6, hidden=hidden, bias=bias, activation="relu")
    _assert_same_density(model, density)
