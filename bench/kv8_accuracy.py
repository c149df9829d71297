"""The error of 8-bit KV caches (int8, fp8_e4m3; per-token and per-tensor scales) against the bf16
cache of the same data, for the README's accuracy table: a decode batch (ragged_paged on the cpu),
K and V drawn from a normal distribution, and the same with outlier channels (a few channels of K
and V 20x larger, as LLM keys have). Prints max and mean |out_8bit - out_bf16| and, for scale, the
bf16 cache's own error against the f32 cache.

    PYTHONPATH=build/python /usr/bin/python3 bench/kv8_accuracy.py
"""
import numpy as np

import attnops

OP = attnops.registry().get("paged")


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def run(k, v, q, dtype, scales="per_token", tensor=None):
    kv, hkv, d = k.shape
    page = 16
    pages = -(-kv // page)
    kw = {}
    if dtype in ("int8", "fp8_e4m3") and scales == "per_tensor":
        qmax = 127.0 if dtype == "int8" else 448.0
        kw = dict(k_scale=float(np.abs(k).max() / qmax), v_scale=float(np.abs(v).max() / qmax))
    cache = attnops.PagedKVCache.host(pages, page, hkv, d, dtype=dtype, scales=scales, **kw)
    slots = np.arange(kv, dtype=np.int64)
    if dtype == "bf16":
        cache.write(f32_to_bf16_bits(k), f32_to_bf16_bits(v), slots, dtype="bf16")
    else:
        cache.write(k, v, slots)
    table = np.arange(pages, dtype=np.int32)[None]
    n = q.shape[0]
    batch = attnops.RaggedBatch(np.array([0, n], np.int32), np.array([kv], np.int32), table)
    qq = q if dtype in ("f32", "int8", "fp8_e4m3") else f32_to_bf16_bits(q)
    res = OP.paged(qq, cache, batch, backend="cpu", causal=False, **(dict(dtype="bf16") if dtype == "bf16" else {}))
    out = res.out
    if out.dtype == np.uint16:  # bf16 bits
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return out.astype(np.float64)


def main():
    rng = np.random.default_rng(0)
    kv, hkv, hq, d, n = 2048, 8, 32, 128, 4
    print("| data (output rms) | cache | max abs err vs bf16 cache | mean abs err vs bf16 cache |")
    print("|---|---|---|---|")
    for data in ("normal", "outlier channels"):
        k = rng.normal(size=(kv, hkv, d)).astype(np.float32)
        v = rng.normal(size=(kv, hkv, d)).astype(np.float32)
        if data == "outlier channels":
            ch = rng.choice(d, 4, replace=False)
            k[..., ch] *= 20
            v[..., ch] *= 20
        q = rng.normal(size=(n, hq, d)).astype(np.float32)
        ref = run(k, v, q, "bf16")
        exact = run(k, v, q, "f32")
        label = f"{data} ({np.sqrt(np.mean(exact ** 2)):.3g})"
        e = np.abs(ref - exact)
        print(f"| {label} | bf16 (its error vs f32) | {e.max():.2e} | {e.mean():.2e} |")
        for dt in ("int8", "fp8_e4m3"):
            for sc in ("per_token", "per_tensor"):
                e = np.abs(run(k, v, q, dt, sc) - ref)
                print(f"| {label} | {dt} {sc} | {e.max():.2e} | {e.mean():.2e} |")


if __name__ == "__main__":
    main()
