"""Per-call overhead of the Python binding: the same attention call made from Python (op(q, k, v))
and from C++ (Operator._time_calls: the same attnops::Attention called n times in a C++ loop on
the same views), in one process, interleaved, median over rounds.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_overhead.py [--calls 2000] [--rounds 15]
        [--threads 1] [--op flash_attn2] [--backend cpu] [--shape B,T,H,D]

Default problem: B1 H1 T16 D64 f32 (numpy and torch inputs), flash_attn2 on the cpu backend, one
thread (--threads 0: OpenMP's default; waking the worker threads then costs both loops, more so
Python's, whose workers go idle between calls). The overhead is python_us - cpp_us: argument
parsing, the array views (buffer protocol / DLPack), releasing the GIL, and wrapping the outputs
(the decision dict is made only when read). Median and minimum over the rounds: on a shared
machine the minimum is the steadier figure."""

import argparse
import statistics
import sys
import time

import numpy as np

import attnops


def measure(op, q, k, v, calls, rounds, **options):
    cpp, py = [], []
    for _ in range(rounds):
        cpp.append(op._time_calls(q, k, v, calls, **options))
        t0 = time.perf_counter()
        for _ in range(calls):
            op(q, k, v, **options)
        py.append((time.perf_counter() - t0) / calls)
    return [1e6 * f(x) for x in (cpp, py) for f in (statistics.median, min)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--op", default="flash_attn2")
    p.add_argument("--backend", default="cpu")
    p.add_argument("--shape", default="1,16,1,64", help="B,T,H,D")
    p.add_argument("--threads", type=int, default=1, help="num_threads (0: OpenMP's default)")
    a = p.parse_args(argv)
    b, t, h, d = (int(x) for x in a.shape.split(","))
    op = attnops.registry().get(a.op, config={"backend": a.backend, "num_threads": a.threads})
    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-1, 1, (b, t, h, d)).astype(np.float32) for _ in range(3))
    cases = [("numpy", (q, k, v), {}), ("numpy, causal+return_lse", (q, k, v), {"causal": True, "return_lse": True})]
    try:
        import torch

        cases.append(("torch", tuple(torch.from_numpy(x) for x in (q, k, v)), {}))
    except ImportError:
        pass
    print(f"attnops {attnops.__version__}: {a.op} on {a.backend}, B{b} H{h} T{t} D{d} f32, threads {a.threads}, "
          f"{a.calls} calls x {a.rounds} rounds; us per call, median (min)")
    print(f"{'inputs':<26} {'C++':>15} {'Python':>15} {'overhead':>15} {'Python/C++':>11}")
    for name, (x, y, z), options in cases:
        op(x, y, z, **options)  # warm up
        cpp, cpp_min, py, py_min = measure(op, x, y, z, a.calls, a.rounds, **options)
        print(f"{name:<26} {cpp:>7.2f} ({cpp_min:>5.2f}) {py:>7.2f} ({py_min:>5.2f}) "
              f"{py - cpp:>7.2f} ({py_min - cpp_min:>5.2f}) {py / cpp:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
