"""``params.yaml`` read as DVC reads it (YAML 1.2) and validated into :class:`~hbnn.config.Params`.

Missing keys take their defaults; unknown keys, wrong types and out-of-range values raise
:class:`~hbnn.config.ConfigError` naming the dotted key and the value, before any data is generated or any
sampler starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from hbnn.config import ConfigError, Params, _show

MAX_VALUES = 10_000  # a params file larger than this, aliases expanded, is refused (a YAML "alias bomb")


def _coerce(value: Any, hint: Any, key: str, default: Any = None) -> Any:
    """Check ``value`` against a type hint; ints are accepted where floats are.

    A section (a dataclass) starts from ``default``, the value it has where it is left out, so keys a
    partial section leaves out keep that section's defaults (``hier_sampler``'s, not :class:`SamplerParams`').
    """
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key, default)
    if origin is tuple:
        (item,) = {a for a in get_args(hint) if a is not Ellipsis}
        # A bare 0 means an empty list, so `hidden_layers: 0` reads as "no hidden layers".
        if isinstance(value, int) and not isinstance(value, bool) and value == 0:
            return ()
        if not isinstance(value, (list, tuple)):
            none = " (or 0 for none)" if item is int else ""  # hidden_layers, sizes (an empty column list is refused)
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected a list of {item.__name__}{none}")
        return tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected true or false")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected a number")
        if not math.isfinite(value):
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected a finite number")
        return float(value)
    if hint is int:
        # 1e3 or 1000.0 (as `dvc exp run -S` may write it) is the integer 1000; 2.5 is not an integer.
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected an integer")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"invalid parameter {key}={_show(value)}: expected a string")
        return value
    raise TypeError(f"unsupported type hint {hint!r} for {key}")  # pragma: no cover


def _build(cls: type, raw: Any, prefix: str, default: Any = None) -> Any:
    """``default`` (``cls()`` where None) with the keys ``raw`` gives, each checked and built the same way."""
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid parameter {prefix or 'params'}={_show(raw)}: expected a mapping")
    default = cls() if default is None else default
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(f"unknown parameter {dotted}={_show(raw[key])}: allowed keys here are {sorted(known)}")
    kwargs = {}
    for name in known:
        if name in raw:
            dotted = f"{prefix}.{name}" if prefix else name
            kwargs[name] = _coerce(raw[name], hints[name], dotted, getattr(default, name))
    return dataclasses.replace(default, **kwargs)


def parse_params(raw: dict[str, Any] | None) -> Params:
    """Validate a nested dict (as loaded from YAML) into :class:`hbnn.config.Params`.

    Missing keys take their defaults.

    Parameters
    ----------
    raw : dict or None
        The parameters as loaded; ``None`` (an empty file) means all defaults.

    Returns
    -------
    hbnn.config.Params

    Raises
    ------
    hbnn.config.ConfigError
        Naming the dotted key of an unknown key, a wrong type or an out-of-range value.
    """
    params = _build(Params, raw or {}, "")
    params.check()
    return params


def _count_values(node: Any, limit: int) -> int:
    """Values in ``node`` with every alias expanded, counting stops past ``limit``."""
    count, todo = 0, [node]
    while todo and count <= limit:
        item = todo.pop()
        count += 1
        if isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return count


def read_yaml(text: str, what: str) -> Any:
    """Parse ``text`` as YAML 1.2, exactly as DVC reads ``params.yaml`` (ruamel.yaml's safe loader).

    PyYAML would read YAML 1.1 instead, where ``010`` is 8, ``yes`` is true and ``1e-5`` is a string, so the stages and
    ``dvc params diff`` would disagree.

    Parameters
    ----------
    text : str
        The file's text.
    what : str
        The file, for messages.

    Returns
    -------
    object
        The parsed document.

    Raises
    ------
    hbnn.config.ConfigError
        If the text is not valid YAML (naming the line and column) or expands past :data:`MAX_VALUES` values.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        raw = YAML(typ="safe").load(text)
    except MarkedYAMLError as err:  # one line: where and what, without ruamel's multi-line excerpt
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(err.problem or err.context or "").split())
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from err
    except YAMLError as err:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(err).split())}") from err
    if _count_values(raw, MAX_VALUES) > MAX_VALUES:
        raise ConfigError(f"{what} holds more than {MAX_VALUES} values once its YAML aliases are expanded; "
                          "write the parameters out plainly")
    return raw


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml`` (YAML 1.2, as DVC reads it).

    Parameters
    ----------
    path : str or pathlib.Path, optional
        The parameter file.

    Returns
    -------
    hbnn.config.Params

    Raises
    ------
    hbnn.config.ConfigError
        If the file is missing, unreadable, not YAML or holds a bad parameter.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise ConfigError(f"parameter file {path} does not exist") from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"parameter file {path} cannot be read: {err}") from err
    return parse_params(read_yaml(text, f"parameter file {path}"))


def unchanged_check(path: str | Path, params: Params):
    """A check for :func:`hbnn.errors.checked_before_commit` that the parameter file still holds ``params``.

    DVC records the params it finds after the stage, so outputs made from earlier values would be recorded as made from
    new ones if the file was edited, or rewritten by another ``dvc exp run`` in the same workspace, while the stage ran.

    Parameters
    ----------
    path : str or pathlib.Path
        The parameter file.
    params : hbnn.config.Params
        The params the stage ran with.

    Returns
    -------
    callable
        The check: it raises :class:`hbnn.errors.ChangedMeanwhile` where the file now holds other (or invalid) params.
    """
    from hbnn.errors import ChangedMeanwhile

    def check() -> None:
        try:
            now = load_params(path)
        except ConfigError as err:
            raise ChangedMeanwhile(f"parameter file {path} changed while the stage ran and is now invalid ({err}); "
                                   "no output was written") from err
        if now != params:
            changed = params_differences(params.to_dict(), now.to_dict())
            raise ChangedMeanwhile(f"parameter file {path} changed while the stage ran ({', '.join(changed[:3])}"
                                   f"{' ...' if len(changed) > 3 else ''}): its outputs were made with the earlier "
                                   "values, so none was written. Another `dvc exp run` in this workspace, or an "
                                   "edit? Check the file and run again (dvc repro)")

    return check


def params_differences(before: Any, after: Any, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every dotted key whose value differs between two nested dicts.

    Parameters
    ----------
    before, after : object
        Nested dicts (or leaf values).
    prefix : str, optional
        The dotted key of ``before`` and ``after``.

    Returns
    -------
    list of str
        One entry per differing key, in key order.
    """
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after)):
            out += params_differences(before.get(key), after.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if before == after else [f"{prefix}: {_show(before)} -> {_show(after)}"]
