"""Time the hierarchical density's gradient split over threads (hbnn.density.threads) and print a table.

For each group count: the default network (2 features, hidden [5, 5], tanh, Bernoulli) over ``--rows`` rows a
group, called through nutpie's logp callback the way a chain calls it, serially (``logp_grad``) and split over
1, 2, ... threads (``logp_grad_threads``); once with one chain calling, once with two chains (two threads) calling
at the same time, as nutpie's chains do. Prints microseconds per gradient (the median of ``--repeats`` timings of
``--calls`` calls each) and the speed-up over the serial callback, and checks that every callback gives the
serial one's bits (exit status 1 where one does not).

    python -m benchmarks.threads                       # 200 and 1,000 groups, up to this machine's cores
    python -m benchmarks.threads --groups 60 --threads 1 2 4
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import threading
import time

import numpy as np

from hbnn.density import densities, threads

P = ctypes.POINTER(ctypes.c_double)


def _density(groups: int, rows: int, seed: int = 0):
    """A hierarchical density of ``groups`` groups of ``rows`` random rows with 0/1 labels."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(groups, rows, 2))
    y = (rng.random(groups * rows) < 0.5) * 1.0
    return densities.HierarchicalDensity(X, y, np.full(groups, rows), (5, 5), False, "bernoulli", 1.0)


def _calls(callback, buf: np.ndarray, theta: np.ndarray, calls: int) -> tuple[float, bytes]:
    """Seconds per call of ``callback`` over ``calls`` calls, and the bits of the last call's value and gradient."""
    grad, value = np.zeros(theta.size), np.zeros(1)
    args = (theta.size, theta.ctypes.data_as(P), grad.ctypes.data_as(P), value.ctypes.data_as(P), buf.ctypes.data)
    start = time.perf_counter()
    for _ in range(calls):
        callback.ctypes(*args)
    return (time.perf_counter() - start) / calls, value.tobytes() + grad.tobytes()


def time_callback(callback, buf: np.ndarray, theta: np.ndarray, chains: int, calls: int, repeats: int):
    """Median microseconds per gradient of one of ``chains`` threads calling ``callback`` at once, and the bits."""
    times, bits = [], set()
    for _ in range(repeats):
        results = [None] * chains

        def chain(c, results=results):
            results[c] = _calls(callback, buf, theta, calls)

        workers = [threading.Thread(target=chain, args=(c,)) for c in range(chains)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times += [r[0] for r in results]
        bits |= {r[1] for r in results}
    return 1e6 * statistics.median(times), bits


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", nargs="*", type=int, default=[200, 1000])
    parser.add_argument("--rows", type=int, default=50, help="rows a group (default 50, the scaling rows')")
    parser.add_argument("--threads", nargs="*", type=int, default=None,
                        help="thread counts a chain (default 1 up to this machine's cores)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    counts = args.threads or list(range(1, cores + 1))
    differ = 0
    print(f"cores {cores}; us per gradient (median of {args.repeats} x {args.calls} calls), speed-up over serial")
    print(f"{'groups':>7} {'chains':>6} {'threads':>8} {'us':>9} {'x':>6}")
    for groups in args.groups:
        density = _density(groups, args.rows)
        buf = density.pack(density.offsets())
        theta = density.initial_center() + np.random.default_rng(1).uniform(-1, 1, int(buf[10]))
        for chains in (1, 2):
            serial_us, want = time_callback(density.callback(0), buf, theta, chains, args.calls, args.repeats)
            print(f"{groups:>7} {chains:>6} {'serial':>8} {serial_us:>9.1f} {1.0:>6.2f}")
            for n in counts:
                if threads.usable(n) != n:
                    print(f"{groups:>7} {chains:>6} {n:>8} {'(numba cannot run these threads here)':>16}")
                    continue
                us, bits = time_callback(density.callback(0, n), buf, theta, chains, args.calls, args.repeats)
                same = "" if bits == want else "  DIFFERENT BITS"
                differ += bits != want
                print(f"{groups:>7} {chains:>6} {n:>8} {us:>9.1f} {serial_us / us:>6.2f}{same}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
