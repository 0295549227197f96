"""Reference pages generated from the code, so that nothing is written twice.

- ``reference/params.md``: every key of ``params.yaml`` with its type, default, the checks that bound it, the
  stages that read it (their ``params:`` in ``dvc.yaml``) and the comment ``params.yaml`` gives it. Types and
  defaults come from :mod:`hbnn.config` through :func:`hbnn.config_schema.params_schema`, the checks from the
  ``_require`` calls of each params dataclass's ``check``.
- ``reference/api/*.md``: one page per subpackage of ``hbnn`` with an ``automodule`` for every public module
  (a module whose dotted name has no part starting with ``_``).

The page texts are plain functions (:func:`params_page`, :func:`api_pages`, :func:`public_modules`), which
``tests/test_docs.py`` checks against the code; the Sphinx hook writes them before the build reads its sources,
rewriting a file only when its text changes.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOCS = ROOT / "docs"

# The stage that lists the whole params file validates every key; it is named once in the page's text instead
# of on every row.
CHECK_STAGE = "check_params"


# ---------------------------------------------------------------------------------------------- params page


def schema_leaves(schema: dict, prefix: str = "") -> dict[str, dict]:
    """Every leaf key of the params schema, dotted (``sampler.advi.iterations``), with its schema entry."""
    out: dict[str, dict] = {}
    for name, entry in schema["properties"].items():
        key = f"{prefix}{name}"
        if entry.get("type") == "object" and "properties" in entry:
            out.update(schema_leaves(entry, f"{key}."))
        else:
            out[key] = entry
    return out


def params_comments(path: Path) -> dict[str, str]:
    """Every key of ``params.yaml`` (sections too), dotted, with the comment the file gives it: the one beside
    it, else the lines just above it ("" where there is none)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    above: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped:
            above = []
            continue
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z_][\w]*):(.*)$", line)
        if not match:
            continue
        indent, name, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([*(n for _, n in stack), name])
        stack.append((indent, name))
        beside = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        text = beside or " ".join(a for a in above if not a.startswith("yaml-language-server"))
        # "name: what it is" above a list names the key itself
        text = re.sub(rf"^{re.escape(name)}:\s*", "", text)
        comments[key] = text
        above = []
    return comments


def stage_readers(dvc_yaml: Path) -> dict[str, list[str]]:
    """The ``params:`` entries of each stage of ``dvc.yaml`` (a section name covers its keys)."""
    stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    out: dict[str, list[str]] = {}
    for stage, spec in stages.items():
        keys = []
        for entry in spec.get("params", []):
            if isinstance(entry, str):
                keys.append(entry)
        out[stage] = keys
    return out


def readers_of(key: str, readers: dict[str, list[str]]) -> list[str]:
    """The stages (other than ``check_params``) whose ``params:`` name ``key`` or a section above it."""
    return [stage for stage, keys in readers.items()
            if any(key == k or key.startswith(f"{k}.") for k in keys)]


def _render(node: ast.expr, section: str, names: dict[str, Any]) -> str:
    """A check's message as text: ``{key}`` becomes the section's key, ``{self.x}`` its sibling ``section.x``,
    and constants of :mod:`hbnn.config` their values."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if not isinstance(node, ast.JoinedStr):
        return ast.unparse(node)
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
            continue
        expr = value.value
        src = ast.unparse(expr)
        if src == "key":
            parts.append(section)
        elif src.startswith("self."):
            parts.append(f"{section}.{src[5:]}")
        else:
            try:
                parts.append(str(eval(src, dict(names))))  # noqa: S307 - constants of hbnn.config only
            except Exception:  # noqa: BLE001 - shown as written when it needs a value
                parts.append(src)
    return "".join(parts)


def params_checks() -> dict[str, list[str]]:
    """The messages of every ``_require`` and ``_check_seed`` in ``hbnn.config``, keyed by the dotted key.

    A section's dataclass checks its fields under the key it is given (``sampler``, ``hier_sampler``,
    ``sampler.advi``, ...); :class:`hbnn.config.Params` checks top-level keys and keys against each other.
    """
    from hbnn import config

    names = {k: getattr(config, k) for k in dir(config) if k.isupper()}
    names["list"] = list
    tree = ast.parse(inspect.getsource(config))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    # Which section keys each dataclass is checked under.
    sections: dict[str, list[str]] = {"Params": [""]}
    params = config.Params()
    for f in config.dataclasses.fields(params):
        value = getattr(params, f.name)
        if config.dataclasses.is_dataclass(value):
            sections.setdefault(type(value).__name__, []).append(f.name)
            for g in config.dataclasses.fields(value):
                inner = getattr(value, g.name)
                if config.dataclasses.is_dataclass(inner):
                    sections.setdefault(type(inner).__name__, []).append(f"{f.name}.{g.name}")

    checks: dict[str, list[str]] = {}
    for cls_name, keys in sections.items():
        cls = classes[cls_name]
        method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "check")
        for call in ast.walk(method):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                continue
            if call.func.id == "_require" and len(call.args) == 4:
                key_node, why_node = call.args[1], call.args[3]
            elif call.func.id == "_check_seed" and len(call.args) == 2:
                key_node, why_node = call.args[1], ast.Constant(f"must lie in [0, {config.MAX_SEED}] (2**32 - 1)")
            else:
                continue
            for section in keys:
                key = _render(key_node, section, names).lstrip(".")
                key = re.sub(r"\[.*\]$", "", key)  # hidden_layers[{i}] -> hidden_layers
                why = _render(why_node, section, names)
                checks.setdefault(key, [])
                if why not in checks[key]:
                    checks[key].append(why)
    return checks


def _type(entry: dict) -> str:
    if "anyOf" in entry:
        return " or ".join(_type(e) if "type" in e else f"`{json.dumps(e['const'])}`" for e in entry["anyOf"])
    if entry.get("type") == "array":
        return f"list of {entry['items']['type']}"
    return entry.get("type", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def params_page() -> str:
    """The text of ``reference/params.md``: one row per key of ``params.yaml``."""
    from hbnn.config_schema import params_schema

    schema = params_schema()
    leaves = schema_leaves(schema)
    comments = params_comments(ROOT / "params.yaml")
    readers = stage_readers(ROOT / "dvc.yaml")
    checks = params_checks()
    descriptions = {name: entry.get("description", "") for name, entry in schema["properties"].items()
                    if entry.get("type") == "object"}

    lines = [
        "---",
        "html_theme.sidebar_secondary.remove: true",  # the tables need the width
        "---",
        "",
        "# Params reference",
        "",
        "<!-- Generated by docs/_ext/hbnn_reference.py from hbnn.config, params.yaml and dvc.yaml: edit those. -->",
        "",
        "Every key of `params.yaml`: its type and default (from the params dataclasses of `hbnn.config`, also",
        "published as `params.schema.json`), the checks that bound it (a value outside them stops the run with one",
        "`error:` line naming the key, before any sampling), the stages that read it (their `params:` in",
        "`dvc.yaml`: changing the key reruns those stages) and the comment `params.yaml` gives it.",
        f"`{CHECK_STAGE}` lists the whole file, so it validates every key and is not repeated below.",
        "A key left out of a params file takes its default; under DVC, `params.yaml` must hold every key",
        "`dvc.yaml` names. `sampler` and `hier_sampler` share their keys and differ in their defaults.",
        "",
    ]
    current = None
    for key, entry in leaves.items():
        section = key.split(".")[0] if "." in key else ""
        if section != current:
            current = section
            title = f"`{section}`" if section else "Top level"
            lines += ["", f"## {title}", ""] if current else [f"## {title}", ""]
            if descriptions.get(section):
                lines += [descriptions[section].replace("``", "`"), ""]
            lines += ["| key | type | default | checks | read by | meaning |", "|---|---|---|---|---|---|"]
        default = json.dumps(entry.get("default")) if "default" in entry else ""
        allowed = entry.get("enum")
        bounds = [f"one of {', '.join(f'`{v}`' for v in allowed)}"] if allowed else []
        bounds += [c for c in checks.get(key, []) if not (allowed and c.startswith("must be one of"))]
        stages = ", ".join(f"`{s}`" for s in readers_of(key, readers) if s != CHECK_STAGE) or "(validated only)"
        lines.append(
            f"| `{key}` | {_type(entry)} | `{default}` | {_cell('; '.join(bounds))} | {stages} | "
            f"{_cell(comments.get(key, ''))} |"
        )
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- API pages


def public_modules() -> list[str]:
    """Every public module of ``hbnn`` (no part of its dotted name starts with ``_``), packages included."""
    out = []
    for path in sorted((SRC / "hbnn").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        out.append(".".join(parts))
    return sorted(out)


def _page_of(module: str) -> str:
    """The API page a module goes on: its subpackage below ``hbnn`` (top-level modules: ``hbnn``)."""
    parts = module.split(".")
    if len(parts) >= 2 and (SRC / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "hbnn"


def api_pages() -> dict[str, str]:
    """``reference/api/<page>.md`` texts: an index and one page per subpackage, one ``automodule`` a module."""
    pages: dict[str, list[str]] = {}
    for module in public_modules():
        pages.setdefault(_page_of(module), []).append(module)
    out = {}
    for page, modules in pages.items():
        title = "Top-level modules" if page == "hbnn" else f"`{page}`"
        body = [f"# {title}", "", "<!-- Generated by docs/_ext/hbnn_reference.py from the docstrings. -->", ""]
        for module in modules:
            body += [f"## `{module}`", "", "```{eval-rst}", f".. automodule:: {module}", "```", ""]
        out[page] = "\n".join(body)
    toc = "\n".join(sorted(pages, key=lambda p: (p != "hbnn", p)))
    out["index"] = textwrap.dedent("""\
        # Python API

        <!-- Generated by docs/_ext/hbnn_reference.py. -->

        Generated from the docstrings: one page per subpackage of `hbnn`, every public module on it.
        The subpackages are layers (see [Development](../../development.md)).

        ```{toctree}
        :maxdepth: 1

        """) + toc + "\n```\n"
    return out


# ------------------------------------------------------------------------------------------------- Sphinx hook


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def write_pages(docs: Path = DOCS) -> None:
    """Write the generated reference pages under ``docs/reference`` (the API folder is rebuilt from scratch)."""
    _write(docs / "reference" / "params.md", params_page())
    api = docs / "reference" / "api"
    pages = api_pages()
    for stale in api.glob("*.md") if api.is_dir() else []:
        if stale.stem not in pages:
            stale.unlink()
    for name, text in pages.items():
        _write(api / f"{name}.md", text)


def _on_builder_inited(app) -> None:
    write_pages(Path(app.srcdir))


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True}
