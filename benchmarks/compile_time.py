"""Time ``nutpie.compile_pymc_model`` for the default hierarchical model in this process.

Run it twice in fresh processes to see whether the second (warm) run reuses
on-disk caches, e.g.::

    PYTENSOR_FLAGS=base_compiledir=/tmp/ptc python benchmarks/compile_time.py   # cold
    PYTENSOR_FLAGS=base_compiledir=/tmp/ptc python benchmarks/compile_time.py   # warm

By default it compiles as the pipeline does (``hbnn.sampling.nutpie_adapter.compile_numba``,
which lets the warm run load nutpie's two wrappers from numba's cache); with the
argument ``plain`` it calls ``nutpie.compile_pymc_model(model, backend="numba")``
as nutpie does by default.

Prints one JSON line: seconds for imports, model build, the two PyTensor
functions (logp+dlogp, expand) and the two ``numba.cfunc`` wrappers.
"""

from __future__ import annotations

import json
import sys
import time

t0 = time.perf_counter()
import numba  # noqa: E402
import nutpie  # noqa: E402
import nutpie.compile_pymc as ncp  # noqa: E402
import pytensor  # noqa: E402

from hbnn.config_read import parse_params  # noqa: E402
from hbnn.data.spec import DataSpec  # noqa: E402
from hbnn.data.tasks import Tasks, make_moons_tasks  # noqa: E402
from hbnn.model.builders import build_hierarchical_model  # noqa: E402
from hbnn.sampling.nutpie_adapter import compile_numba  # noqa: E402

t_import = time.perf_counter() - t0


def main() -> None:
    phases: dict[str, float] = {}
    real_make, real_cfunc = ncp._make_functions, numba.cfunc

    def timed_make(*args, **kwargs):
        start = time.perf_counter()
        out = real_make(*args, **kwargs)
        phases["pytensor_functions"] = time.perf_counter() - start
        return out

    def timed_cfunc(*args, **kwargs):
        wrap = real_cfunc(*args, **kwargs)

        def apply(fn):
            start = time.perf_counter()
            out = wrap(fn)
            phases[f"cfunc_{fn.__name__}"] = time.perf_counter() - start
            return out

        return apply

    ncp._make_functions, numba.cfunc = timed_make, timed_cfunc
    params = parse_params({})
    tasks = Tasks(make_moons_tasks(DataSpec.of(params)))
    pad = tasks.padded("train")
    start = time.perf_counter()
    model = build_hierarchical_model(pad.X, pad.y, pad.valid, tasks.group_names, tasks.features,
                                     params.model.hidden_layers)
    build = time.perf_counter() - start
    how = sys.argv[1] if len(sys.argv) > 1 else "hbnn"
    start = time.perf_counter()
    if how == "plain":
        nutpie.compile_pymc_model(model, backend="numba")
    else:
        compile_numba(model)
    total = time.perf_counter() - start
    print(json.dumps({
        "import_s": round(t_import, 2), "build_s": round(build, 2), "compile_s": round(total, 2),
        **{k: round(v, 2) for k, v in phases.items()},
        "numba_cache": bool(pytensor.config.numba__cache), "compiledir": str(pytensor.config.base_compiledir),
        "compiled_by": how,
    }))


if __name__ == "__main__":
    main()
