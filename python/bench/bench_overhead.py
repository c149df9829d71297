"""Per-call overhead of the Python binding: the same attention call made from Python (op(q, k, v))
and from C++ (Operator._time_calls: the same attnops::Attention called n times in a C++ loop on
the same views), in one process, interleaved, median over rounds.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_overhead.py [--calls 2000] [--rounds 15]
        [--threads 1] [--op flash_attn2] [--backend cpu] [--shape B,T,H,D]

Default problem: B1 H1 T16 D64 f32 (numpy and torch inputs), flash_attn2 on the cpu backend, one
thread (--threads 0: OpenMP's default; waking the worker threads then costs both loops, more so
Python's, whose workers go idle between calls). The overhead is python_us - cpp_us: argument
parsing, the array views (buffer protocol / DLPack), releasing the GIL, and wrapping the outputs
(the decision dict is made only when read). Thread CPU time is the steadier figure on a shared
machine (time spent descheduled is not counted); wall time is printed too."""

import argparse
import statistics
import sys
import time

import numpy as np

import attnops


def measure(op, q, k, v, calls, rounds, **options):
    """Per call, in microseconds: {"wall": (C++, Python), "cpu": (C++, Python)}, medians over the
    rounds. cpu is the calling thread's CPU time (time.thread_time / CLOCK_THREAD_CPUTIME_ID):
    with one thread the whole call runs there, and time spent descheduled on a shared machine
    is not counted."""
    cpp_wall, cpp_cpu, py_wall, py_cpu = [], [], [], []
    for _ in range(rounds):
        w, c = op._time_calls(q, k, v, calls, **options)
        cpp_wall.append(w)
        cpp_cpu.append(c)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            op(q, k, v, **options)
        c1, t1 = time.thread_time(), time.perf_counter()
        py_wall.append((t1 - t0) / calls)
        py_cpu.append((c1 - c0) / calls)
    med = statistics.median
    return {"wall": (1e6 * med(cpp_wall), 1e6 * med(py_wall)), "cpu": (1e6 * med(cpp_cpu), 1e6 * med(py_cpu))}


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
          f"{a.calls} calls x {a.rounds} rounds; us per call (median over rounds)")
    print(f"{'inputs':<26} {'clock':<11} {'C++':>8} {'Python':>8} {'overhead':>9} {'Python/C++':>11}")
    for name, (x, y, z), options in cases:
        op(x, y, z, **options)  # warm up
        m = measure(op, x, y, z, a.calls, a.rounds, **options)
        for clock, label in (("cpu", "thread CPU"), ("wall", "wall")):
            cpp, py = m[clock]
            print(f"{name:<26} {label:<11} {cpp:>8.2f} {py:>8.2f} {py - cpp:>9.2f} {py / cpp:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
