"""DVC stage `derive_prior`: see `hbnn.pipeline.derive_prior`."""

import sys

from hbnn.cli import run_stage
from hbnn.pipeline import derive_prior

if __name__ == "__main__":
    sys.exit(run_stage(__doc__, ["hier_trace", "prior_out", "metrics_out"], derive_prior))
