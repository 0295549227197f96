"""The report stage, as a package.

The `report` stage: figures, a Markdown and a self-contained HTML report, summary metrics.

Scores (accuracy; RMSE, lpd and coverage where the likelihood is not a classifier) and diagnostics are read
from the fit stages' metrics files, never recomputed. Posterior quantities the
metrics do not hold (decision surfaces, group sds, weight correlations) come
from the traces, one model and one group at a time, so memory does not grow
with draws x grid x groups.

Surfaces are drawn over the first two features; with more features the others
are held at their training mean, and with a single feature there are no
surfaces (the report says so).

Modules: ``numbers`` (models, references, formatting, surface grids), ``document``
(Markdown and HTML rendering), ``inputs`` (reading and checking traces and metrics),
``figures`` (each model's surfaces, calibration and scores from its trace, in worker processes),
``metric_figures`` (figures from the metrics files and the group-level draws), ``plots`` (matplotlib drawing),
``sections``, ``status``, ``transfer_section`` and ``winner`` (prose), ``outputs`` (summary metrics, plots CSVs) and
``stage`` (the stage body, :func:`hbnn.report.stage.report`).
"""
