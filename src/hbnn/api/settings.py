"""The estimators' keyword arguments as ``params.yaml``'s settings.

Each estimator declares which keyword is which dotted params key (:func:`keywords`); :func:`to_params` builds the
checked :class:`hbnn.config.Params` a fit stage would read, through the same parser as ``params.yaml``
(:func:`hbnn.config_read.parse_params`), so a keyword takes exactly the values its key takes and a bad one is the same
one-line error, naming the keyword instead of the key. :func:`from_params` goes the other way, for the stages, which
build their estimator from ``params.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hbnn.config import AdviParams, ConfigError, Params
from hbnn.config_read import parse_params
from hbnn.errors import InputError

MODEL_KEYS = ("hidden_layers", "activation", "likelihood", "bias", "noise_sd")  # every estimator's network

SAMPLER_KEYS = ("backend", "chains", "tune", "draws", "target_accept", "seed", "cores", "mass_matrix", "max_draws")

DATA_KEYS = {"group": "data.group", "split": "data.split", "standardize": "data.standardize"}

OTHER_KEYS = {"pointwise": "trace.pointwise", "max_minutes": "limits.max_minutes",
              "max_memory_gib": "limits.max_memory_gib"}


def keywords(sampler: str, model_extra: Sequence[str] = (), sampler_extra: Sequence[str] = ()) -> dict[str, str]:
    """An estimator's keywords and the dotted params key of each.

    Parameters
    ----------
    sampler : str
        The params section of its sampler settings: ``sampler`` (per-group fits) or ``hier_sampler``.
    model_extra : sequence of str, optional
        ``model`` keys beyond :data:`MODEL_KEYS` that it reads (the flat model's ``prior_sd``).
    sampler_extra : sequence of str, optional
        Sampler keys beyond :data:`SAMPLER_KEYS` (``refit_target_accept``, ``restarts``).

    Returns
    -------
    dict of str to str
        Keyword to dotted key; the ADVI settings are ``advi_<name>``.
    """
    out = dict(DATA_KEYS)
    out.update({k: f"model.{k}" for k in (*MODEL_KEYS, *model_extra)})
    out.update({k: f"{sampler}.{k}" for k in (*SAMPLER_KEYS, *sampler_extra)})
    out.update({f"advi_{f}": f"{sampler}.advi.{f}" for f in AdviParams.__dataclass_fields__})
    out.update(OTHER_KEYS)
    return out


def lookup(params: Params, dotted: str) -> Any:
    """The value of a dotted key in ``params`` (tuples as lists, as ``params.yaml`` writes them).

    Parameters
    ----------
    params : hbnn.config.Params
        The params.
    dotted : str
        The key (``hier_sampler.advi.iterations``).

    Returns
    -------
    object
    """
    node: Any = params
    for part in dotted.split("."):
        node = getattr(node, part)
    return list(node) if isinstance(node, tuple) else node


def defaults(names: Mapping[str, str]) -> dict[str, Any]:
    """Each keyword's default: its key's value in the default :class:`hbnn.config.Params` (``params.yaml``'s).

    Parameters
    ----------
    names : mapping of str to str
        Keyword to dotted key (:func:`keywords`).

    Returns
    -------
    dict of str to object
    """
    params = Params()
    return {kw: lookup(params, dotted) for kw, dotted in names.items()}


def from_params(params: Params, names: Mapping[str, str]) -> dict[str, Any]:
    """The keywords that give ``params``' settings (:func:`lookup` of each key in ``names``).

    Parameters
    ----------
    params : hbnn.config.Params
        The params.
    names : mapping of str to str
        Keyword to dotted key (:func:`keywords`).

    Returns
    -------
    dict of str to object
    """
    return {kw: lookup(params, dotted) for kw, dotted in names.items()}


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays as Python's, so ``chains=np.int64(2)`` is read as ``chains=2``."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    return value


def to_params(values: Mapping[str, Any], names: Mapping[str, str], features: Sequence[str], label: str) -> Params:
    """The checked params a fit with these keyword values reads.

    Parameters
    ----------
    values : mapping of str to object
        Keyword values (``get_params()``).
    names : mapping of str to str
        Keyword to dotted key (:func:`keywords`).
    features : sequence of str
        The feature columns (``data.features``).
    label : str
        The label's name (``data.label``).

    Returns
    -------
    hbnn.config.Params
        Checked: every value and every key against the others.

    Raises
    ------
    hbnn.errors.InputError
        Naming the keyword and its value where a value is of the wrong type or out of range.
    """
    raw: dict[str, Any] = {"data": {"source": "table", "features": list(features), "label": label}}
    for kw, dotted in names.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _plain(values[kw])
    try:
        return parse_params(raw)
    except ConfigError as err:
        raise InputError(renamed(str(err), names)) from None


def renamed(message: str, names: Mapping[str, str]) -> str:
    """``message`` with every dotted params key in it named as its keyword (``hier_sampler.tune`` as ``tune``).

    Parameters
    ----------
    message : str
        A :class:`hbnn.config.ConfigError`'s or a table check's message.
    names : mapping of str to str
        Keyword to dotted key (:func:`keywords`).

    Returns
    -------
    str
    """
    by_key = {dotted: kw for kw, dotted in names.items()}
    by_key.update({"data.features": "feature columns (the columns of X)", "data.label": "label (y's name)"})
    pattern = re.compile("|".join(re.escape(k) for k in sorted(by_key, key=len, reverse=True)) + r"(?![\w.])")
    text = pattern.sub(lambda m: by_key[m.group(0)], message)
    return text.replace("invalid parameter ", "invalid setting ", 1)


def unknown(cls: type, given: Mapping[str, Any]) -> InputError:
    """The error for keywords ``cls`` does not take, naming them and the closest it does.

    Parameters
    ----------
    cls : type
        The estimator class.
    given : mapping of str to object
        The unknown keywords and their values.

    Returns
    -------
    hbnn.errors.InputError
    """
    import difflib
    import inspect

    known = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "unknown")]
    bad = sorted(given)
    near = difflib.get_close_matches(bad[0], known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return InputError(f"{cls.__name__} has no setting {', '.join(map(repr, bad))}{hint}; its settings are "
                      f"{', '.join(known)}")

