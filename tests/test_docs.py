"""The docs: every Python snippet runs, and the generated reference covers every params key and public module.

Snippets run in the repository root, one namespace per page, in page order. A snippet whose first line starts
with ``# After `make repro``` reads the pipeline's outputs, and one whose first line starts with ``# Samples``
compiles and samples: both run where ``HBNN_DOCS_SNIPPETS=all`` (CI, after ``make repro``) and are skipped
otherwise, so that ``make test`` stays fast on a fresh clone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

from hbnn.config import Params

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import hbnn_reference  # noqa: E402

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEAVY = ("# After `make repro`", "# Samples")


def pages() -> list[Path]:
    """The hand-written pages (the generated reference pages hold no snippets) and the README."""
    found = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "reference" not in p.parts]
    return sorted([*found, ROOT / "README.md"])


def snippets(page: Path) -> list[str]:
    return FENCE.findall(page.read_text(encoding="utf-8"))


def _run(page: Path, heavy: bool, monkeypatch) -> None:
    blocks = [s for s in snippets(page) if s.startswith(HEAVY) == heavy]
    if not blocks:
        pytest.skip(f"{page.name} has no such snippets")
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{page.relative_to(ROOT)} (python snippet {i + 1})", "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_snippets_run(page, monkeypatch):
    _run(page, heavy=False, monkeypatch=monkeypatch)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a page's sampling snippets fit several models at default settings (python-api.md, README)
@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_snippets_after_repro_run(page, monkeypatch):
    if os.environ.get("HBNN_DOCS_SNIPPETS") != "all":
        pytest.skip("needs the pipeline's outputs or samples: HBNN_DOCS_SNIPPETS=all (CI, after make repro)")
    _run(page, heavy=True, monkeypatch=monkeypatch)


def test_pages_have_snippets_and_heavy_ones_say_so():
    """The extraction finds the snippets, and a heavy snippet is marked on its first line only."""
    found = {p.name: snippets(p) for p in pages()}
    assert sum(len(s) for s in found.values()) >= 10
    for name, blocks in found.items():
        for code in blocks:
            assert not any(marker in code.split("\n", 1)[-1] for marker in HEAVY), name


def _leaves(obj, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        out += _leaves(value, f"{key}.") if dataclasses.is_dataclass(value) else [key]
    return out


def test_params_reference_lists_every_key():
    """Every key of the params dataclasses (and of the committed params.yaml) has its row on the page."""
    page = hbnn_reference.params_page()
    keys = _leaves(Params())
    assert len(keys) > 50
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert not missing, f"keys missing from the params reference: {missing}"
    yaml_keys = set(hbnn_reference.params_comments(ROOT / "params.yaml"))
    yaml_leaves = {k for k in yaml_keys if not any(other.startswith(f"{k}.") for other in yaml_keys)}
    assert len(yaml_leaves) > 50 and yaml_leaves <= set(keys), sorted(yaml_leaves - set(keys))
    for key in keys:  # the row says which stages read it: every key that a stage lists names that stage
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.count("|") >= 7, row


def test_params_reference_names_checks_and_readers():
    page = hbnn_reference.params_page()
    row = next(line for line in page.splitlines() if line.startswith("| `hier_sampler.target_accept` |"))
    assert "`0.98`" in row and "strictly between 0 and 1" in row and "`fit_hier`" in row and "`transfer_prior`" in row
    row = next(line for line in page.splitlines() if line.startswith("| `n_groups` |"))
    assert "must be >= 1" in row and "`make_data`" in row


def test_api_reference_lists_every_public_module():
    """Every module under src/hbnn whose dotted name has no part starting with ``_`` gets an automodule."""
    text = "\n".join(hbnn_reference.api_pages().values())
    modules = []
    for path in (ROOT / "src" / "hbnn").rglob("*.py"):
        parts = path.relative_to(ROOT / "src").with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(p.startswith("_") for p in parts):
            modules.append(".".join(parts))
    assert len(modules) > 50
    missing = [m for m in modules if f".. automodule:: {m}\n" not in text]
    assert not missing, f"public modules missing from the API reference: {missing}"


def test_readme_is_a_front_door():
    """At most 200 lines, links into the docs, and no work-log words where users read."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for page in pages():
        if page.parent == DOCS:
            assert f"docs/{page.name}" in readme or page.name == "index.md", page.name
    log_words = re.compile(r"\b(session|sessions|turn \d+)\b|\b20\d\d-\d\d-\d\d\b", re.I)
    for page in pages():
        hits = [line for line in page.read_text(encoding="utf-8").splitlines() if log_words.search(line)]
        assert not hits, (page.name, hits)
