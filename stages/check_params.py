"""DVC stage `check_params`: validate all of params.yaml and the run's cost (see
`hbnn.pipeline.preflight.check_params`)."""

import _checkout  # noqa: F401 - first: this checkout's src/ before any installed hbnn

from hbnn.errors import exit_stage, interrupts_reported

PATHS = []

if __name__ == "__main__":
    with interrupts_reported(exit_now=True):
        from hbnn.pipeline.preflight import check_params
        from hbnn.pipeline.runner import run_stage

        exit_stage(run_stage(__doc__, PATHS, check_params))
