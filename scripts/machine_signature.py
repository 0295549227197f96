"""Print, or record, what decides the last bits of this machine's fits: the CPU as numba compiles for it and the SIMD
paths NumPy dispatches to.

Usage: ``python scripts/machine_signature.py`` prints one line, ``<cpu name> <hash>``;
``python scripts/machine_signature.py --write`` records it in ``.ci/outputs-machine``, beside outputs committed from
this machine's ``make repro``.

The same params give byte-identical traces and metrics on machines with the same line (and the same pins). Where
the line differs, the hand-written density's float32 sums run in another order (numba compiles its loops for the
host CPU, and pads the rows to the vector width it finds: :func:`hbnn.density.buffer.row_lanes`) and NumPy's ``exp``
and ``log`` may take other SIMD paths, so the draws differ in their last bits and the chains, and every number
after them, move within their Monte Carlo error. ``.ci/run`` reads the recorded line: on the machine that made the
committed outputs a fresh clone's ``make repro`` must leave ``git status`` clean; on another it must leave every
accuracy within ``scripts/check_metrics_drift.py``'s tolerances.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / ".ci" / "outputs-machine"


def signature() -> str:
    """This machine's line: numba's name for the CPU and a hash of what it and NumPy target.

    Returns
    -------
    str
    """
    import llvmlite.binding as llvm
    import numba
    import numpy as np
    from numba.core import codegen, config

    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    name = config.CPU_NAME or llvm.get_host_cpu_name()
    features = config.CPU_FEATURES or codegen.get_host_cpu_features()
    numpy_simd = sorted(k for k, on in __cpu_features__.items() if on)
    what = (name, features, numpy_simd, numba.__version__, np.__version__)
    return f"{name} {hashlib.sha256(repr(what).encode()).hexdigest()[:12]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"record the line in {RECORD.name}")
    line = signature()
    if parser.parse_args().write:
        RECORD.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
