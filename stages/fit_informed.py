"""DVC stage `fit_informed`: see `hbnn.pipeline.fit_informed`."""

import sys

from hbnn.cli import run_stage
from hbnn.pipeline import fit_informed

if __name__ == "__main__":
    sys.exit(run_stage(__doc__, ["tasks_path", "prior_path", "trace_out", "metrics_out", "timing_out"], fit_informed))
