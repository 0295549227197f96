"""The transfer experiment over data seeds (``benchmarks/transfer_seeds.py``), as the report reads it: which params
a study measured, and its file checked before anything is shown.
"""

from __future__ import annotations

from pathlib import Path

from hbnn.config import Params
from hbnn.pipeline.variants import STAGE_PARAMS

STAGES = ("make_data", "transfer_prior", "transfer_refit", "transfer")  # the stages a study runs per seed
# the keys a study varies, so they stay out of its params hash: each seed and each prior method is one run of it
VARIED = ("seed", "prior.method")
SEEDS_FILE = Path("benchmarks/transfer_seeds.json")  # where the committed study lies, from the workspace's root


def study_keys() -> list[str]:
    """The params the transfer stages read (:data:`hbnn.pipeline.variants.STAGE_PARAMS`), but :data:`VARIED`.

    ``prior`` is listed key by key, so that ``prior.method`` alone stays out.
    """
    keys: list[str] = []
    for stage in STAGES:
        for key in STAGE_PARAMS[stage]:
            expanded = [f"prior.{k}" for k in Params().to_dict()["prior"]] if key == "prior" else [key]
            keys += [k for k in expanded if k not in VARIED and k not in keys]
    # a key inside one already listed (model.bias inside model) adds nothing
    return sorted(k for k in keys if not any(k.startswith(f"{other}.") for other in keys))


def study_hash(params: Params) -> str:
    """The short hash (:meth:`hbnn.config.Params.section_hash`) of :func:`study_keys`: equal for two params files
    whose transfer stages differ only in ``seed`` and ``prior.method``."""
    return params.section_hash(*study_keys())
