"""DVC stage `derive_prior`: see `hbnn.pipeline.stages.derive_prior`."""

import _checkout  # noqa: F401 - first: this checkout's src/ before any installed hbnn

from hbnn.errors import exit_stage, interrupts_reported

PATHS = ["hier_trace", "prior_out", "metrics_out"]

if __name__ == "__main__":
    with interrupts_reported(exit_now=True):  # an interrupt while the libraries load ends without a traceback too
        from hbnn.pipeline.runner import run_stage
        from hbnn.pipeline.stages.derive_prior import derive_prior

        exit_stage(run_stage(__doc__, PATHS, derive_prior))
