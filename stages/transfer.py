"""DVC stage `transfer`: see `hbnn.pipeline.stages.transfer`."""

import _checkout  # noqa: F401 - first: this checkout's src/ before any installed hbnn

from hbnn.errors import exit_stage, interrupts_reported

PATHS = ["tasks_path", "hier_trace", "prior_path", "prior_metrics", "refit_metrics", "flat_trace_out",
         "informed_trace_out", "metrics_out", "plot_out", "timing_out"]

if __name__ == "__main__":
    with interrupts_reported(exit_now=True):  # an interrupt while the libraries load ends without a traceback too
        from hbnn.pipeline.runner import run_stage
        from hbnn.pipeline.stages.transfer import run_transfer

        exit_stage(run_stage(__doc__, PATHS, run_transfer))
