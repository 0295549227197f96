"""DVC stage `make_data`: see `hbnn.pipeline.make_data`."""

import sys

from hbnn.cli import run_stage
from hbnn.pipeline import make_data

if __name__ == "__main__":
    sys.exit(run_stage(__doc__, ["out"], make_data))
