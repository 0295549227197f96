"""dvc.yaml is the contract: every stage must declare the code it runs and params that exist."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hbnn.pipeline.variants import STAGE_PARAMS

ROOT = Path(__file__).resolve().parents[1]
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def _hbnn_imports(path: Path) -> set[str]:
    """``hbnn`` modules ``path`` imports; ``from hbnn.pkg import name`` counts ``hbnn.pkg.name`` too (a submodule)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hbnn":
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hbnn.")}
    return out


def _module_file(module: str) -> Path | None:
    """The file that runs when ``module`` is imported: ``pkg/mod.py``, or a package's ``__init__.py`` where it holds
    code (a docstring-only ``__init__`` cannot change what a stage computes, so it is no dependency)."""
    base = ROOT / "src" / module.replace(".", "/")
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    init = base / "__init__.py"
    return init if init.exists() and _holds_code(init) else None


def _holds_code(init: Path) -> bool:
    """Whether a package's ``__init__.py`` holds more than a docstring and ``__version__``."""
    for node in ast.parse(init.read_text()).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        version = isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
        if not (docstring or version):
            return True
    return False


def import_closure(script: Path) -> set[str]:
    """Repo-relative paths of every ``hbnn`` module a script imports, directly or not (the packages whose
    ``__init__`` holds code among them)."""
    seen: set[str] = set()
    todo = _hbnn_imports(script)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo |= {".".join(parts[:i]) for i in range(2, len(parts))}  # importing a module runs its packages' inits
        path = _module_file(module)
        if path is not None:
            todo |= _hbnn_imports(path)
    return {path.relative_to(ROOT).as_posix() for m in seen if (path := _module_file(m)) is not None}


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_declares_exactly_the_code_it_runs(stage):
    """A stage reruns exactly when code it runs changes: no missing dep, and no dep it does not import."""
    spec = DVC["stages"][stage]
    script = ROOT / "stages" / f"{stage}.py"
    assert f"stages/{stage}.py" in spec["cmd"]
    deps = {d if isinstance(d, str) else next(iter(d)) for d in spec["deps"]}
    code = {d for d in deps if d.startswith(("src/", "stages/"))}
    needed = import_closure(script) | {f"stages/{stage}.py"}
    assert needed <= code, f"{stage} runs but does not declare {sorted(needed - code)}"
    assert code <= needed, f"{stage} declares {sorted(code - needed)}, which it does not import"


def test_package_inits_with_code_are_deps():
    """A package ``__init__`` that holds code runs on every import of the package, so the closure counts it (and
    the test above then asks each stage that imports it to declare it); docstring-only ones are no dependency."""
    inits = {init.relative_to(ROOT).as_posix() for init in (ROOT / "src").rglob("__init__.py") if _holds_code(init)}
    assert "src/hbnn/model/likelihoods/__init__.py" in inits
    assert "src/hbnn/model/likelihoods/__init__.py" in import_closure(ROOT / "stages" / "check_params.py")
    # hbnn's own __init__ holds the API's lazy exports: code every stage runs, so every stage declares it
    assert "src/hbnn/__init__.py" in inits
    assert "src/hbnn/__init__.py" in import_closure(ROOT / "stages" / "check_params.py")


SAMPLERS = ("pymc", "pytensor", "nutpie", "jax", "numpyro", "blackjax")


@pytest.mark.parametrize("stage", ["check_params", "make_data", "derive_prior", "report"])
def test_light_stages_import_no_sampler(stage):
    """These stages only read or write arrays; loading a sampler would cost seconds and widen their deps."""
    modules = [m.removeprefix("src/").removesuffix(".py").replace("/", ".")
               for m in sorted(import_closure(ROOT / "stages" / f"{stage}.py"))]
    code = f"import sys; import {', '.join(modules)}; print([m for m in {SAMPLERS!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{stage} imports {out.strip()}"


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_params_exist(stage):
    for key in DVC["stages"][stage].get("params", []):
        if isinstance(key, dict):  # `- params.yaml:` (the whole file)
            assert key == {"params.yaml": None}
            continue
        node = PARAMS
        for part in key.split("."):
            assert part in node, f"{stage} lists params key {key!r} that params.yaml lacks"
            node = node[part]


def test_every_params_key_is_validated_by_a_stage():
    """A key no stage lists would never be read; check_params lists the whole file instead."""
    assert {"params.yaml": None} in DVC["stages"]["check_params"]["params"]
    assert "runner.py" in str(DVC["stages"]["check_params"]["deps"])  # cheap: test_light_stages_import_no_sampler


def test_n_groups_and_seed_reach_make_data():
    assert {"n_groups", "seed"} <= set(DVC["stages"]["make_data"]["params"])


@pytest.mark.parametrize("stage", sorted(STAGE_PARAMS))
def test_provenance_hash_covers_exactly_the_declared_params(stage):
    assert list(STAGE_PARAMS[stage]) == DVC["stages"][stage]["params"]


def test_stage_scripts_import_the_hbnn_of_their_own_checkout(tmp_path):
    """A queued experiment runs in a copy of the repository; its stages must run that copy's code, not the code of
    the checkout that the editable install points at (which may have changed since the experiment was queued)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "stages", copy / "stages")
    shutil.copytree(ROOT / "src", copy / "src")
    probe = f"import sys; sys.path.insert(0, {str(copy / 'stages')!r}); import _checkout, hbnn; print(hbnn.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(copy / "src" / "hbnn" / "__init__.py")
    for script in sorted((ROOT / "stages").glob("[a-z]*.py")):
        lines = script.read_text().splitlines()
        first_hbnn = next(i for i, line in enumerate(lines) if "from hbnn" in line or "import hbnn" in line)
        assert any(line.startswith("import _checkout") for line in lines[:first_hbnn]), script.name


def test_params_yaml_survives_the_overrides_the_readme_shows(tmp_path):
    """``dvc exp run -S`` rewrites params.yaml whole (every list in block style, comments kept); a list with a
    comment beside it then came out broken when set to ``[]`` (ruamel.yaml), and ``sampler.advi.*`` could not be
    set where params.yaml had no ``advi`` block. Applied one after another, as a workspace's experiments are."""
    from dvc.utils.hydra import apply_overrides

    from hbnn.config_read import load_params

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text())
    for overrides in (["n_groups=40"], ["model.hidden_layers=[]"], ["transfer.sizes=[]"], ["data.features=[a]"],
                      ["model.hidden_layers=[3]"], ["sampler.advi.iterations=5000"],
                      ["hier_sampler.advi.minibatch_size=500"], ["transfer.sizes=[2,4]"], ["model.hidden_layers=[]"]):
        apply_overrides(str(path), overrides)
    raw = yaml.safe_load(path.read_text())
    assert raw["n_groups"] == 40 and raw["model"]["hidden_layers"] == [] and raw["transfer"]["sizes"] == [2, 4]
    for key in ("chains", "tune"):  # the lines ruamel.yaml ran together
        assert raw["sampler"][key] == PARAMS["sampler"][key]
    params = load_params(path)
    assert params.sampler.advi.iterations == 5000 and params.hier_sampler.advi.minibatch_size == 500


def _declared(entries) -> list[str]:
    """The paths of a stage's (or the top level's) ``deps``, ``outs``, ``metrics`` or ``plots`` entries."""
    return [p for e in entries or [] for p in ([e] if isinstance(e, str) else e)]


TIMING_OUTS = sorted(m.group(1) for s in DVC["stages"].values() if (m := re.search(r"--timing-out (\S+)", s["cmd"])))


def test_wall_clock_timings_are_no_stage_output_dependency_or_metric():
    """Timings differ on every run: declared anywhere in dvc.yaml, their hashes in dvc.lock (and a report that
    shows them) would change on every ``dvc repro``, and a fresh clone's ``make repro`` leave ``git status`` dirty."""
    assert len(TIMING_OUTS) == 6  # fit_flat, fit_hier, fit_informed, transfer_prior, transfer_refit, transfer
    declared = {p for s in DVC["stages"].values() for k in ("deps", "outs", "metrics", "plots")
                for p in _declared(s.get(k))}
    declared |= {p for k in ("metrics", "plots") for p in _declared(DVC.get(k))}
    assert not {p for p in declared if p.startswith("timings")}
    # no stage reads them: a cmd names timings only in its --timing-out
    assert not [n for n, s in DVC["stages"].items() if "timings" in re.sub(r"--timing-out \S+", "", s["cmd"])]


def test_wall_clock_timings_are_ignored_by_git():
    """Neither tracked nor shown as untracked: a rerun rewrites them."""
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "rev-parse", "--is-inside-work-tree"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    assert subprocess.run([*git, "ls-files", "timings"], capture_output=True, text=True, check=True).stdout == ""
    ignored = subprocess.run([*git, "check-ignore", "--no-index", *TIMING_OUTS], capture_output=True, text=True)
    assert sorted(ignored.stdout.split()) == TIMING_OUTS


def test_make_repro_drops_dvcs_push_hint_and_nothing_else():
    """The line ``dvc repro`` prints after every run that reran a stage, as the installed DVC writes it, is what
    the Makefile's filter matches (grep's basic regex; ``$$`` is make's ``$``)."""
    import importlib.util

    source = Path(importlib.util.find_spec("dvc.commands.repro").origin).read_text()
    hint = re.search(r'ui\.write\("(Use `dvc push`[^"]*)"\)', source).group(1)
    pattern = re.search(r"^PUSH_HINT := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).replace("$$", "$")
    assert re.search(pattern, hint)
    for line in ("Data and pipelines are up to date.", "Running stage 'fit_flat':", f"{hint} ", "Use dvc pull"):
        assert not re.search(pattern, line)
