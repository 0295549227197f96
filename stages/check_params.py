"""DVC stage `check_params`: validate all of params.yaml, even keys no other stage reads (see `hbnn.config`)."""

import sys

from hbnn.cli import interrupts_reported, run_stage

PATHS = []

if __name__ == "__main__":
    with interrupts_reported():
        from hbnn.config import check_params

        sys.exit(run_stage(__doc__, PATHS, check_params))
