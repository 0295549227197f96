"""DVC stage `report`: see `hbnn.report.report`."""

import sys

from hbnn.cli import run_stage
from hbnn.report import report

if __name__ == "__main__":
    sys.exit(
        run_stage(
            __doc__,
            ["tasks_path", "flat_trace", "hier_trace", "informed_trace", "prior_path", "metrics_dir", "timings_dir",
             "out_dir"],
            report,
        )
    )
