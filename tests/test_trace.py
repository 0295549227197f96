"""hbnn.files.trace.Trace: what the fit stages write instead of ArviZ's InferenceData, read back by ArviZ unchanged."""

import subprocess
import sys
from pathlib import Path

import arviz as az
import numpy as np
import pytest
import xarray as xr

from hbnn.files.trace import Trace


def _groups():
    rng = np.random.default_rng(0)
    posterior = xr.Dataset({"w": (("chain", "draw", "k"), rng.normal(size=(2, 5, 3)))},
                           coords={"chain": [0, 1], "draw": np.arange(5), "k": ["a", "b", "c"]}, attrs={"hbnn": "x"})
    stats = xr.Dataset({"diverging": (("chain", "draw"), np.zeros((2, 5), dtype=bool)),
                        "n_steps": (("chain", "draw"), np.full((2, 5), 7, dtype=np.uint64))})
    observed = xr.Dataset({"y": ("obs", np.array([0, 1, 1]))})
    return {"observed_data": observed, "warmup_sample_stats": stats[["n_steps"]], "sample_stats": stats,
            "posterior": posterior}


def test_groups_in_arviz_order_as_items_and_attributes():
    trace = Trace(**_groups())
    assert trace.groups() == ["posterior", "sample_stats", "observed_data", "warmup_sample_stats"]
    assert trace.groups() == az.InferenceData(**_groups()).groups()
    assert trace.posterior is trace["posterior"] and "sample_stats" in trace and len(trace) == 4
    with pytest.raises(AttributeError, match="no group 'prior'"):
        _ = trace.prior
    with pytest.raises(TypeError, match="not an xarray.Dataset"):
        Trace(posterior=np.zeros(3))


@pytest.mark.parametrize("compress", [False, True])
def test_arviz_reads_the_file_as_if_it_had_written_it(tmp_path, compress):
    ours, theirs = tmp_path / "ours.nc", tmp_path / "theirs.nc"
    Trace(**_groups()).to_netcdf(ours, compress=compress)
    az.InferenceData(**_groups()).to_netcdf(str(theirs), compress=compress)
    a, b = az.from_netcdf(str(ours)), az.from_netcdf(str(theirs))
    assert a.groups() == b.groups()
    for group in a.groups():
        xr.testing.assert_identical(a[group].load(), b[group].load())
        assert a[group]["chain"].dtype == b[group]["chain"].dtype if "chain" in a[group].coords else True


def test_to_arviz_holds_the_same_groups():
    idata = az.InferenceData(**_groups())
    trace = Trace(**_groups())
    assert trace.groups() == idata.groups()
    back = trace.to_arviz()
    for group in idata.groups():
        xr.testing.assert_identical(back[group], idata[group])


def test_the_report_imports_arviz_only_once_its_workers_have_forked():
    """The report's workers read their traces and draw their pages without ArviZ, so its import (~3 s) runs beside
    them in the main process instead of before they start."""
    code = "import sys, hbnn.report.stage, hbnn.report.figures; print('arviz' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_stages_before_the_report_do_not_import_arviz():
    """ArviZ's import (pyplot, SciPy's stats, a numba ufunc compiled at import) costs a stage ~2.5 s; only the
    report, which draws ArviZ's plots, should pay it."""
    stages = ("make_data", "fit_flat", "fit_hier", "derive_prior", "fit_informed", "transfer", "transfer_refit")
    modules = ["hbnn.pipeline.budget", "hbnn.pipeline.preflight", *(f"hbnn.pipeline.stages.{s}" for s in stages),
               "hbnn.cli"]
    code = f"""
import sys
import numpy as np
for m in {modules!r}:
    __import__(m)
from hbnn.density import densities, kernel
from hbnn.sampling.nutpie_adapter import trace_from_raw
from hbnn.sampling.nutpie_adapter import load as nutpie
rng = np.random.default_rng(0)
density = densities.FlatDensity.on_rows(rng.normal(size=(20, 2)), rng.integers(0, 2, 20), (3,), False, "bernoulli", 1.0,
                                     prior_sd=1.0)
model = density.nutpie_model()
trace = trace_from_raw(nutpie().sample(model, draws=5, tune=5, chains=1, seed=1, progress_bar=False,
                                      return_raw_trace=True), model.coords)
assert trace.posterior.sizes["draw"] == 5
print(sorted(m for m in sys.modules if m.split('.')[0] in ('arviz', 'matplotlib', 'pymc')))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nutpie_uses_the_real_arviz_once_it_asks_for_it():
    """The stand-in that keeps ArviZ out of nutpie's import forwards to the real package, imported on first use,
    and leaves sys.modules to it."""
    code = """
import sys
from hbnn.sampling.nutpie_adapter import load as nutpie
nutpie()
assert "arviz" not in sys.modules
sample = sys.modules["nutpie.sample"]  # (the package binds the name to its function)
import arviz
assert sample.arviz is not arviz and sample.arviz.from_dict is arviz.from_dict
assert sample.arviz.InferenceData is arviz.InferenceData and sys.modules["arviz"] is arviz
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ok"


@pytest.mark.parametrize("engine", ["h5netcdf", "netcdf4"])
def test_groups_written_through_one_store_read_back_as_to_netcdf_writes_them(tmp_path, engine):
    """hbnn.files.trace.write_netcdf_groups against xarray's own Dataset.to_netcdf, group by group: the same variables,
    dtypes (bools, strings, unsigned ints), coordinates and attributes, in a root group and in named ones."""
    from hbnn.files.trace import write_netcdf_groups

    groups = _groups()
    groups["observed_data"] = groups["observed_data"].assign_coords(obs_group=("obs", ["g1", "g1", "g2"]))
    groups["observed_data"].attrs = {"source": "moons", "n": 3, "scale": [0.5, 2.0]}
    root = groups.pop("posterior")
    ours, theirs = tmp_path / "ours.nc", tmp_path / "theirs.nc"
    write_netcdf_groups({None: root, **groups}, ours, engine)
    root.to_netcdf(theirs, engine=engine)
    for name, ds in groups.items():
        ds.to_netcdf(theirs, mode="a", group=name, engine=engine)
    for name in [None, *groups]:
        with xr.open_dataset(ours, group=name, engine=engine) as a, xr.open_dataset(theirs, group=name,
                                                                                     engine=engine) as b:
            xr.testing.assert_identical(a.load(), b.load())
            for var in a.variables:
                assert a[var].dtype == b[var].dtype, (name, var)
    with pytest.raises(ValueError, match="h5netcdf or netcdf4"):
        write_netcdf_groups({None: root}, tmp_path / "x.nc", "scipy")


def test_writing_a_trace_does_not_import_dask_distributed(tmp_path):
    """xarray's to_netcdf asks Dask which scheduler runs, and Dask imports distributed to answer (~0.3-0.4 s a
    stage process); the stages' writer does not ask."""
    code = ("import sys, xarray as xr, numpy as np\nfrom hbnn.files import outputs as io\n"
            "from hbnn.files.trace import Trace\n"
            f"ds = xr.Dataset({{'w': (('chain', 'draw'), np.zeros((2, 3)))}})\n"
            f"io.write_netcdf(Trace(posterior=ds, sample_stats=ds), {str(tmp_path / 't.nc')!r})\n"
            f"io.write_netcdf(ds, {str(tmp_path / 'd.nc')!r})\n"
            "print(sorted(m for m in sys.modules if m == 'distributed' or m.startswith('distributed.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert xr.open_dataset(tmp_path / "t.nc", group="sample_stats")["w"].shape == (2, 3)


def test_a_stage_process_builds_its_datasets_without_importing_dask_array(tmp_path):
    """xarray imports dask.array (~0.5 s) to ask whether each new variable is a Dask array, and dask (~0.1 s) to
    ask whether a variable it decodes is a Dask collection; a stage process tells it none is
    (hbnn.pipeline.runner.skip_dask_array_lookup), and reads and writes the same values."""
    out = tmp_path / "tasks.nc"
    code = (f"import sys\nfrom hbnn.pipeline.runner import run_stage\n"
            f"from hbnn.pipeline.stages.make_data import make_data\n"
            f"assert run_stage('make_data', ['out'], make_data, ['--out', {str(out)!r}]) == 0\n"
            f"from hbnn.pipeline.stages import load_run_tasks\nfrom hbnn.config_read import load_params\n"
            f"tasks = load_run_tasks({str(out)!r}, load_params('params.yaml'))\n"
            "print(tasks.n_groups, 'dask.array' in sys.modules, 'dask' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.stdout.split() == ["18", "False", "False"]
    with xr.open_dataset(out) as ds:  # this process imports dask.array as usual, and reads the same file
        assert ds["X"].shape == (1800, 2) and "g00" in ds["group"].values


def test_check_params_on_moons_imports_neither_xarray_nor_pandas_nor_scipy():
    """check_params, the first stage of every run, checks every key and every stage's cost from params alone on
    moons data: ~0.2 s of a process, where importing xarray, pandas (and pyarrow) and SciPy cost ~0.7 s more."""
    code = ("import sys\nfrom hbnn.pipeline.runner import run_stage\nfrom hbnn.pipeline.preflight import check_params\n"
            "assert run_stage('check_params', [], check_params, []) == 0\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'xarray', 'pandas', 'pyarrow', 'scipy', 'dask'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.stdout.strip() == "[]"
    assert "fit_hier: estimated" in run.stderr


def test_check_params_on_a_table_reads_it_without_importing_dask():
    """On a table, check_params loads xarray and pandas to read it as make_data does, after the stage's own call to
    hbnn.pipeline.runner.skip_dask_array_lookup: the table's check installs it then, so dask (~0.5 s) stays out."""
    root = Path(__file__).resolve().parents[1]
    code = ("import sys, yaml\nfrom hbnn.config_read import parse_params\n"
            "from hbnn.pipeline.preflight import check_params\n"
            f"raw = yaml.safe_load(open({str(root / 'params.yaml')!r}))\n"
            f"raw['data'].update(source='table', path={str(root / 'data/examples/sites.csv')!r})\n"
            "check_params(parse_params(raw))\n"
            "print('xarray' in sys.modules, 'dask' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert run.stdout.split() == ["True", "False"]
