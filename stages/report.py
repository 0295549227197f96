"""DVC stage `report`: see `hbnn.report.stage`."""

import _checkout  # noqa: F401 - first: this checkout's src/ before any installed hbnn

from hbnn.errors import exit_stage, interrupts_reported

PATHS = [
    "tasks_path", "flat_trace", "hier_trace", "informed_trace", "prior_path", "metrics_dir", "out_dir",
]

if __name__ == "__main__":
    with interrupts_reported(exit_now=True):  # an interrupt while the libraries load ends without a traceback too
        from hbnn.pipeline.runner import run_stage
        from hbnn.report.stage import report

        exit_stage(run_stage(__doc__, PATHS, report))
