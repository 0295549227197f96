"""The JSON Schema of ``params.yaml`` (``params.schema.json``), for editors: keys, types, defaults and allowed
words, from the params dataclasses of :mod:`hbnn.config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, get_args, get_origin, get_type_hints

from hbnn.config import (
    ACTIVATIONS,
    ALIGN_METHODS,
    BACKENDS,
    LIKELIHOODS,
    MASS_MATRICES,
    NOISES,
    PRIOR_METHODS,
    SOURCES,
    Params,
)

# Values a string key may take, for the JSON schema (the checks above enforce them too).
ENUMS = {
    "data.source": SOURCES,
    "model.likelihood": LIKELIHOODS,
    "model.activation": ACTIVATIONS,
    "model.noise": NOISES,
    "sampler.backend": BACKENDS,
    "sampler.mass_matrix": MASS_MATRICES,
    "prior.method": PRIOR_METHODS,
    "prior.align": ALIGN_METHODS,
}


def _schema(hint: Any, default: Any, key: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(hint):
        hints = get_type_hints(hint)
        return {
            "type": "object",
            "description": (hint.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
            "properties": {f.name: _schema(hints[f.name], getattr(default, f.name), f"{key}.{f.name}".lstrip("."))
                           for f in fields(hint)},
            "additionalProperties": False,
        }
    if get_origin(hint) is tuple:
        (item,) = {a for a in get_args(hint) if a is not Ellipsis}
        array = {"type": "array", "items": {"type": _JSON_TYPES[item]}}
        schema = {"anyOf": [array, {"const": 0}]} if item is int else array  # hidden_layers: 0 means []
        return {**schema, "default": list(default)}
    out: dict[str, Any] = {"type": _JSON_TYPES[hint]}
    if default is not None:
        out["default"] = default
    if key in ENUMS:
        out["enum"] = list(ENUMS[key])
    return out


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def params_schema() -> dict[str, Any]:
    """JSON Schema of ``params.yaml`` (keys, types, defaults, allowed words), for editors.

    Published as ``params.schema.json``; ranges and cross-key rules are checked
    by :func:`load_params` only.
    """
    schema = _schema(Params, Params(), "")
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "hbnn params.yaml"})
    return schema
