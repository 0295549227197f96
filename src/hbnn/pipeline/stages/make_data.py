"""Stage ``make_data``: generate (moons) or read and check (table) the tasks."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from hbnn.config import Params
from hbnn.data.spec import DataSpec
from hbnn.data.tasks import Tasks, make_tasks
from hbnn.files.io import provenance
from hbnn.files.outputs import staged_outputs
from hbnn.pipeline import budget
from hbnn.pipeline.transfer import data_name, require_groups
from hbnn.pipeline.variants import STAGE_PARAMS

log = logging.getLogger(__name__)


def make_data(params: Params, out: Path) -> None:
    """Stage body: generate (moons) or read and check (table) the tasks and write ``data/tasks.nc``.

    For tables ``n_groups`` is not used: the groups are the table's.

    Parameters
    ----------
    params : hbnn.config.Params
        The run's settings (``data``, ``seed``, ``n_groups``, ``model.likelihood``).
    out : pathlib.Path
        Where the tasks file goes.

    Raises
    ------
    hbnn.errors.InputError
        If the table is missing or bad, it has too few groups for the transfer experiment, or the estimate
        exceeds the budget.
    """
    estimate = budget.data_estimate(params)
    if estimate is not None:
        budget.enforce(estimate, params)
    ds = make_tasks(DataSpec.of(params))
    require_groups(Tasks(ds).n_groups, data_name(params))  # a table's, before the fit stages sample
    ds.attrs.update(provenance("make_data", params.data.source, params.section_hash(*STAGE_PARAMS["make_data"]),
                               {"n_groups": params.n_groups, "seed": params.seed,
                                "data": dataclasses.asdict(params.data),
                                "likelihood": params.model.likelihood}))
    with staged_outputs() as outputs:
        outputs.write_netcdf(ds, out)
    log.info("wrote %s: %d groups, %d rows", out, Tasks(ds).n_groups, ds.sizes["obs"])
