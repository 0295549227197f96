"""The Python API: the three models as scikit-learn estimators, beside the pipeline.

:class:`HierarchicalBNN`, :class:`FlatBNN` and :class:`InformedBNN` take ``params.yaml``'s settings as keywords,
``fit(X, y)`` a DataFrame of features and a group column, and give back an ArviZ ``InferenceData`` (``idata_``),
per-group convergence diagnostics, and predictions as ``hbnn predict`` makes them; :func:`load` reads a fitted model
back from its trace, including the pipeline's ``traces/*.nc``. The fit stages run these same estimators.
"""

from hbnn.api.base import BNNEstimator
from hbnn.api.estimators import FlatBNN, HierarchicalBNN, InformedBNN
from hbnn.api.persist import load

__all__ = ["BNNEstimator", "FlatBNN", "HierarchicalBNN", "InformedBNN", "load"]
