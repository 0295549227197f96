"""DVC stage `fit_hier`: see `hbnn.pipeline.fit_hier`."""

import sys

from hbnn.cli import run_stage
from hbnn.pipeline import fit_hier

if __name__ == "__main__":
    sys.exit(run_stage(__doc__, ["tasks_path", "trace_out", "metrics_out", "timing_out"], fit_hier))
