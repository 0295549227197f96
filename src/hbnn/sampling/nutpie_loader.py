"""nutpie, imported without importing ArviZ.

``nutpie.sample`` imports ArviZ at its top, whose own import (matplotlib's
pyplot, SciPy's stats, a numba ufunc compiled at import) costs a stage process
~2.5 s on a 2-core machine. nutpie uses it only to convert traces (``from_dict``,
``from_datatree``) and in its return annotations; hbnn asks for nutpie's raw
trace and converts it itself (:func:`hbnn.sampling.nutpie_trace._arrow_idata`). So while
nutpie imports, ``arviz`` is a stand-in (:class:`_ArvizOnDemand`) that holds a
placeholder for the annotations; once nutpie is in, the stand-in leaves
``sys.modules`` (a later ``import arviz`` gets the real package) and forwards
every attribute nutpie asks of it to the real ArviZ, imported then.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types

_LOCK = threading.Lock()


class _ArvizOnDemand(types.ModuleType):
    """``arviz`` as nutpie's modules see it: the real package's attributes, the package imported on first use."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module("arviz"), name)


class _Placeholder:
    """Stands for ``arviz.InferenceData`` in nutpie's annotations while nutpie imports."""


def nutpie() -> types.ModuleType:
    """The ``nutpie`` package, imported (once) without importing ArviZ where ArviZ is not loaded already."""
    with _LOCK:
        if "nutpie" in sys.modules or "arviz" in sys.modules:
            return importlib.import_module("nutpie")
        stand_in = _ArvizOnDemand("arviz", "ArviZ, imported when nutpie first uses it (hbnn.sampling.nutpie_loader)")
        stand_in.InferenceData = _Placeholder
        sys.modules["arviz"] = stand_in
        try:
            return importlib.import_module("nutpie")
        finally:
            if sys.modules.get("arviz") is stand_in:
                del sys.modules["arviz"]
            del stand_in.InferenceData  # from now on, the real class
