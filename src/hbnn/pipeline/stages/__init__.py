"""The body of each DVC stage, one module per stage (``src/`` mirrors ``dvc.yaml``), and how they read the tasks.

The scripts in ``stages/`` only parse paths and call these through
:func:`hbnn.pipeline.runner.run_stage`. Each module imports only what its stage runs, so a
stage's ``deps`` in ``dvc.yaml`` are exactly its code: ``make_data`` and
``derive_prior`` import no sampler. The report stage's body is
:func:`hbnn.report.stage.report`. Inputs are checked before anything is sampled;
outputs are written together and atomically at the very end.
"""

from __future__ import annotations

from pathlib import Path

from hbnn.data.tasks import Tasks, load_tasks
from hbnn.files.io import check_made_with


def load_run_tasks(path: Path, params) -> Tasks:
    """Return :func:`hbnn.data.tasks.load_tasks`'s tasks of the file a stage is handed, which must also have been
    made with the run's ``params`` (:func:`hbnn.files.io.check_made_with`) and for their likelihood.

    Parameters
    ----------
    path : pathlib.Path
        The tasks file (``data/tasks.nc``).
    params : hbnn.config.Params
        The run's params.

    Returns
    -------
    hbnn.data.tasks.Tasks

    Raises
    ------
    hbnn.errors.InputError
        As :func:`hbnn.data.tasks.load_tasks`, or if the file was made with other params.
    """
    return load_tasks(path, params.model.likelihood,
                      check_attrs=lambda attrs: check_made_with(attrs, params, path, "make_data"))
