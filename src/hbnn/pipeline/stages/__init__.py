"""The body of each DVC stage, one module per stage (``src/`` mirrors ``dvc.yaml``).

The scripts in ``stages/`` only parse paths and call these through
:func:`hbnn.pipeline.runner.run_stage`. Each module imports only what its stage runs, so a
stage's ``deps`` in ``dvc.yaml`` are exactly its code: ``make_data`` and
``derive_prior`` import no sampler. The report stage's body is
:func:`hbnn.report.stage.report`. Inputs are checked before anything is sampled;
outputs are written together and atomically at the very end.
"""
