"""The informed prior's derivation, and the default moons data, give the same bytes whatever BLAS kernel, SIMD code
and libm a machine picks.

Two subprocesses run ``derive_prior``'s computation (:func:`hbnn.fitting.prior.derive`: chain alignment,
new-group draws, mean and covariance, metrics) on one synthetic hierarchical posterior: one as this machine
chooses, one as an older x86-64 machine would, through environment variables read at import:

- ``OPENBLAS_CORETYPE=Prescott``: OpenBLAS's SSE3 kernels (no FMA, other blocking) instead of the CPU's own;
- ``NPY_DISABLE_CPU_FEATURES``: every SIMD target NumPy dispatches to at run time, off;
- ``GLIBC_TUNABLES``: glibc's libm without its FMA and AVX2 variants (which differ in the last bit).

Each subprocess also computes a probe that those variables do change: a matrix product (BLAS), and NumPy's own
standard normal draw from a generator state where libm's last bit reaches the draw (found by search: glibc 2.36
gives 4.094660341428687 with FMA and ...686 without). Where a probe shows no change (not OpenBLAS, not x86-64,
another libm) its test is skipped rather than passed.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hbnn
from hbnn.model.network import layer_specs

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the configurations are x86-64 ones")

HIDDEN = (5, 5)
CHAINS, DRAWS = 2, 150
# A PCG64 state whose next standard normal lies in the ziggurat's tail, where NumPy calls libm's log1p.
TAIL_STATE = {"bit_generator": "PCG64", "state": {"state": 210327255977152278923218599020447226500,
                                                  "inc": 7937318808080196428804369945471644491},
              "has_uint32": 0, "uinteger": 0}

SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np, xarray as xr
import hashlib
from hbnn.config import PriorParams
from hbnn.config_read import parse_params
from hbnn.data.spec import DataSpec
from hbnn.data.moons import make_moons_tasks
from hbnn.model.network import layer_specs
from hbnn.model.prior import new_group_draws
from hbnn.fitting.prior import derive
src, out, state = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
arrays = np.load(src)
specs = layer_specs(2, (5, 5), False)
posterior = xr.Dataset({name: (("chain", "draw", *s.dims) if name.startswith("mu_") else ("chain", "draw"),
                               arrays[name]) for s in specs for name in (f"mu_{s.name}", f"sd_{s.name}")})
fitted, metrics = derive(PriorParams(draws_per_sample=10), posterior, specs, "tanh", 7, src)
a, b = np.random.default_rng(5).normal(size=(2, 96, 96))
raw = np.random.default_rng()
raw.bit_generator.state = state
ours = np.random.default_rng()
ours.bit_generator.state = state
(tail,) = new_group_draws([np.zeros((1, 1))], [np.ones(1)], 1, ours)
result = {"fitted": [[x.tobytes().hex() for x in pair] for pair in fitted],
          "metrics": json.dumps(metrics, default=lambda v: repr(float(v)), sort_keys=True),
          "blas_probe": (a @ b).tobytes().hex(), "numpy_tail": repr(raw.standard_normal()),
          "our_tail": repr(float(tail[0, 0])),
          "moons": hashlib.sha256(make_moons_tasks(DataSpec.of(parse_params({})))["X"].values.tobytes()).hexdigest()}
out.write_text(json.dumps(result))
"""


def synthetic_posterior(seed: int = 0) -> dict[str, np.ndarray]:
    """Group means and sds of a (2 features, 5, 5) network: chain 1 a relabelled copy of chain 0's mode (so the
    alignment permutes and flips units), sds in (0.2, 0.6)."""
    rng = np.random.default_rng(seed)
    specs = layer_specs(2, HIDDEN, False)
    out = {}
    for s in specs:
        centre = rng.normal(size=s.shape)
        draws = centre + 0.1 * rng.normal(size=(CHAINS, DRAWS, *s.shape))
        out[f"mu_{s.name}"] = draws
        out[f"sd_{s.name}"] = 0.2 + 0.4 * rng.random((CHAINS, DRAWS))
    # relabel chain 1: swap hidden units 0 and 3 of the first layer, flipping unit 0's sign
    w_in, w_mid = out["mu_in"][1], out["mu_h1_h2"][1]
    w_in[..., [0, 3]] = w_in[..., [3, 0]]
    w_mid[..., [0, 3], :] = w_mid[..., [3, 0], :]
    w_in[..., 3] *= -1
    w_mid[..., 3, :] *= -1
    return out


def run_configuration(src: Path, out: Path, forced: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES", "GLIBC_TUNABLES")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(hbnn.__file__).parents[1]), env.get("PYTHONPATH", "")])
    if forced:
        env["OPENBLAS_CORETYPE"] = "Prescott"
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(np.show_config(mode="dicts")["SIMD Extensions"]["found"])
        env["GLIBC_TUNABLES"] = "glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F,-AVX512DQ,-FMA4,-AVX"
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(src), str(out), json.dumps(TAIL_STATE)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def configurations(tmp_path_factory):
    """The results of this machine's configuration and the forced one (run at once)."""
    tmp = tmp_path_factory.mktemp("reproducible")
    src = tmp / "posterior.npz"
    np.savez(src, **synthetic_posterior())
    procs = {forced: run_configuration(src, tmp / f"{forced}.json", forced) for forced in (False, True)}
    for proc in procs.values():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    return tuple(json.loads((tmp / f"{forced}.json").read_text()) for forced in (False, True))


def test_derive_prior_gives_the_same_bytes_under_other_blas_and_simd(configurations):
    native, forced = configurations
    if native["blas_probe"] == forced["blas_probe"]:
        pytest.skip("OPENBLAS_CORETYPE changes no matrix product here (another BLAS or CPU)")
    assert native["fitted"] == forced["fitted"]
    assert native["metrics"] == forced["metrics"]


def test_new_group_draws_do_not_depend_on_libm(configurations):
    native, forced = configurations
    if native["numpy_tail"] == forced["numpy_tail"]:
        pytest.skip("GLIBC_TUNABLES changes no libm result that NumPy's normal draw reaches here")
    assert native["our_tail"] == forced["our_tail"]
    assert abs(float(native["our_tail"])) > 3.65  # the draw stays in the tail


def test_the_default_moons_data_do_not_depend_on_the_blas_kernel(configurations):
    """The rotation of each group (hbnn.data.moons.rotate) is what BLAS computed with fused multiply-adds,
    everywhere."""
    native, forced = configurations
    if native["blas_probe"] == forced["blas_probe"]:
        pytest.skip("OPENBLAS_CORETYPE changes no matrix product here (another BLAS or CPU)")
    assert native["moons"] == forced["moons"]
