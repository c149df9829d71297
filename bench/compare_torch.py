#!/usr/bin/python3
"""Time PyTorch's CPU attention and attnops on the same shapes; print attnops/torch speed ratios.

PyTorch (Debian's python3-torch, 1.13 on bookworm) is timed two ways, f32, BHTD tensors:
  composed  softmax(q k^T * scale [+ causal mask]) v, three ops, the S x S matrix materialised
  sdpa      torch's fused scaled_dot_product_attention, where this torch has one (2.0+; 1.13 has
            only the private torch.nn.functional._scaled_dot_product_attention, used if present)
attnops is timed by its Google Benchmark binary (bench/bench_attention, --benchmark_format=json):
the Attention/<op>/cpu/f32/<causal|full>/B1_H<H>_T<T>_D<D> benchmarks, which call the public API.

Both sides use every core (torch.set_num_threads(os.cpu_count()); OpenMP's default for attnops),
real (wall) time, best of --repeats for torch and Google Benchmark's mean for attnops. GFLOP/s
counts 4*B*H*D*visible_pairs for both (causal: T(T+1)/2 pairs), so causal numbers are comparable.

  /usr/bin/python3 bench/compare_torch.py --bench build/bench/bench_attention
  /usr/bin/python3 bench/compare_torch.py --bench ... --seq 512,1024 --dims 64 --ops flash_attn2
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def torch_times(torch, B, H, T, D, causal, repeats):
    """Best wall time (s) of the composed path and of SDPA (None if this torch has none)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(B, H, T, D, generator=g) * 2 - 1 for _ in range(3))
    scale = 1.0 / D ** 0.5
    mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else None

    def composed():
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), v)

    sdpa_fn = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa_fn is not None:
        def sdpa():
            return sdpa_fn(q, k, v, is_causal=causal)
    else:
        private = getattr(torch.nn.functional, "_scaled_dot_product_attention", None)
        if private is not None:
            def sdpa():
                # 1.13 signature: (q, k, v, attn_mask, dropout_p, need_attn_weights, is_causal)
                return private(q, k, v, None, 0.0, False, causal)[0]
        else:
            sdpa = None

    def best(fn):
        with torch.no_grad():
            fn()  # warm-up (allocator, thread pool)
            t = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                t = min(t, time.perf_counter() - t0)
        return t

    return best(composed), (best(sdpa) if sdpa else None)


def attnops_times(bench, ops, shapes, min_time):
    """{(op, causal, H, T, D): (seconds, label)} from the Google Benchmark binary."""
    names = "|".join(
        f"Attention/{op}/cpu/f32/{'causal' if c else 'full'}/B1_H{H}_T{T}_D{D}/"
        for op in ops for (H, T, D, c) in shapes)
    cmd = [bench, f"--benchmark_filter={names}", "--benchmark_format=json",
           f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res = {}
    pat = re.compile(r"Attention/([^/]+)/cpu/f32/(causal|full)/B1_H(\d+)_T(\d+)_D(\d+)/")
    for b in json.loads(out)["benchmarks"]:
        m = pat.match(b["name"])
        if not m or b.get("run_type") == "aggregate":
            continue
        unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        key = (m.group(1), m.group(2) == "causal", int(m.group(3)), int(m.group(4)), int(m.group(5)))
        res[key] = (b["real_time"] * unit, b.get("label", ""))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/bench_attention", help="bench_attention binary")
    ap.add_argument("--ops", default="flash_attn2,blocksparse")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", default="512,1024,2048", help="sequence lengths")
    ap.add_argument("--dims", default="64,128", help="head dims")
    ap.add_argument("--repeats", type=int, default=3, help="torch runs per shape (best is kept)")
    ap.add_argument("--min-time", type=float, default=0.5, help="Google Benchmark min time per case (s)")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("compare_torch.py: PyTorch is missing; install Debian's python3-torch and run with /usr/bin/python3")
    if not os.path.exists(a.bench):
        sys.exit(f"compare_torch.py: {a.bench} not found; build the bench_attention target and pass --bench")
    torch.set_num_threads(os.cpu_count() or 1)
    ops = a.ops.split(",")
    shapes = [(a.heads, int(t), int(d), c) for t in a.seq.split(",") for d in a.dims.split(",") for c in (False, True)]
    ours = attnops_times(a.bench, ops, shapes, a.min_time)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; attnops: {a.bench}")
    hdr = f"{'shape':<26}{'torch composed':>16}{'torch sdpa':>12}" + "".join(f"{op + ' (x torch)':>26}" for op in ops)
    print(hdr)
    print("-" * len(hdr))
    for (H, T, D, causal) in shapes:
        pairs = T * (T + 1) / 2 if causal else T * T
        gflop = 4.0 * H * D * pairs * 1e-9
        tc, ts = torch_times(torch, 1, H, T, D, causal, a.repeats)
        best_torch = min(x for x in (tc, ts) if x is not None)
        row = f"{f'H{H} T{T} D{D} ' + ('causal' if causal else 'full'):<26}{gflop / tc:>11.1f} GF/s"
        row += f"{gflop / ts:>7.1f} GF/s" if ts else f"{'n/a':>12}"
        for op in ops:
            got = ours.get((op, causal, H, T, D))
            if got is None:
                row += f"{'missing':>26}"
                continue
            t, _ = got
            row += f"{gflop / t:>12.1f} GF/s {best_torch / t:>7.2f}x"
        print(row)
    print("x torch = best torch time / attnops time (higher is faster); GF/s counts visible pairs only.")


if __name__ == "__main__":
    main()
