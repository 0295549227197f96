"""DVC stage `fit_flat`: see `hbnn.pipeline.stages.fit_flat`."""

import _checkout  # noqa: F401 - first: this checkout's src/ before any installed hbnn

from hbnn.errors import exit_stage, interrupts_reported

PATHS = ["tasks_path", "trace_out", "metrics_out", "timing_out"]

if __name__ == "__main__":
    with interrupts_reported(exit_now=True):  # an interrupt while the libraries load ends without a traceback too
        from hbnn.pipeline.runner import run_stage
        from hbnn.pipeline.stages.fit_flat import fit_flat

        exit_stage(run_stage(__doc__, PATHS, fit_flat))
