"""Serving from Python: a paged KV cache, ragged batches, plans and merge_states, against the float64
reference applied per sequence (reference.attention with Tq = q_len, Tk = kv_len), on native and cpu.
Tolerances per dtype are the dense ones (reference.TOLERANCE)."""
import os
import subprocess
import tempfile
import sys

import numpy as np
import pytest

import attnops
import reference as ref

OP = attnops.registry().get("paged")


def make_batch(rng, q_lens, kv_lens, page_size, num_pages, hq, hkv, d, dv, dtype):
    """A cache with every sequence's keys written through random (permuted) pages, its batch and q."""
    max_pages = max(1, max(-(-kv // page_size) for kv in kv_lens))
    cache = attnops.PagedKVCache.host(num_pages, page_size, hkv, d, head_dim_v=dv, dtype=dtype)
    pages = rng.permutation(num_pages)[: len(kv_lens) * max_pages].reshape(len(kv_lens), max_pages).astype(np.int32)
    dense = []
    for s, kv in enumerate(kv_lens):
        k = ref.to_storage(rng.uniform(-1, 1, (kv, hkv, d)).astype(np.float32), dtype)
        v = ref.to_storage(rng.uniform(-1, 1, (kv, hkv, dv)).astype(np.float32), dtype)
        j = np.arange(kv)
        slots = (pages[s, j // page_size].astype(np.int64) * page_size + j % page_size)
        cache.write(k, v, slots, dtype=dtype if dtype == "bf16" else None)
        dense.append((k, v))
    n = sum(q_lens)
    q = ref.to_storage(rng.uniform(-1, 1, (n, hq, d)).astype(np.float32), dtype)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    batch = attnops.RaggedBatch(cu, np.asarray(kv_lens, np.int64), pages)
    return cache, batch, q, dense, cu


def reference(q, dense, cu, dtype, **options):
    outs, lses = [], []
    for s, (k, v) in enumerate(dense):
        qs = ref.to_f64(q[cu[s]:cu[s + 1]], dtype)[None]
        o, lse, _ = ref.attention(qs, ref.to_f64(k, dtype)[None], ref.to_f64(v, dtype)[None], **options)
        outs.append(o[0])
        lses.append(lse[0].T)
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("backend", ["native", "cpu"])
@pytest.mark.parametrize("case", [
    dict(q_lens=[1, 1, 1], kv_lens=[5, 17, 33], page_size=16),                        # decode
    dict(q_lens=[1, 4, 9, 0], kv_lens=[40, 11, 9, 3], page_size=3),                   # mixed, q_len 0
    dict(q_lens=[7, 1], kv_lens=[30, 1], page_size=1, sliding_window=(5, 0)),         # window over pages
    dict(q_lens=[6, 2], kv_lens=[19, 25], page_size=4, chunk_size=8, logits_soft_cap=5.0),
    dict(q_lens=[3, 5], kv_lens=[3, 20], page_size=16, sinks=True, causal=False),
])
def test_paged_matches_the_reference_per_sequence(dtype, backend, case):
    case = dict(case)
    rng = np.random.default_rng(hash((dtype, backend, str(case))) % 2**32)
    hq, hkv, d, dv = 4, 2, 12, 10
    q_lens, kv_lens, page_size = case.pop("q_lens"), case.pop("kv_lens"), case.pop("page_size")
    cache, batch, q, dense, cu = make_batch(rng, q_lens, kv_lens, page_size, 64, hq, hkv, d, dv, dtype)
    if case.pop("sinks", False):
        case["sinks"] = rng.uniform(-1, 1, hq).astype(np.float32)
    kw = dict(dtype="bf16") if dtype == "bf16" else {}
    res = OP.paged(q, cache, batch, return_lse=True, backend=backend, **kw, **case)
    assert res.decision["backend"] == backend and res.decision["operator"] == "ragged_paged"
    want_out, want_lse = reference(q, dense, cu, dtype, **case)
    got = ref.to_f64(res.out, dtype)
    tol_out, tol_lse = ref.TOLERANCE[dtype]
    assert res.out.shape == (len(q), hq, dv) and res.lse.shape == (len(q), hq)
    np.testing.assert_allclose(got, want_out, atol=tol_out * 4, rtol=0)
    np.testing.assert_allclose(res.lse, want_lse, atol=tol_lse * 4, rtol=0)


def test_a_plan_is_reused_and_batch_invariant():
    rng = np.random.default_rng(7)
    cache, batch, q, dense, cu = make_batch(rng, [1, 5, 1], [700, 9, 1300], 16, 260, 4, 1, 16, 16, "f32")
    plan = attnops.plan_paged(batch, cache, num_tokens=len(q), num_q_heads=4, kv_split_tokens=256)
    assert plan.num_seqs == 3 and plan.num_tokens == len(q) and plan.kv_split_tokens == 256
    assert plan.q_len(1) == 5 and plan.kv_len(2) == 1300 and plan.num_work_items >= 3
    a = OP.paged(q, cache, plan, backend="cpu", num_threads=2)
    b = OP.paged(q, cache, plan, backend="cpu", num_threads=1)
    assert a.decision["batch_invariant"] is True
    np.testing.assert_array_equal(a.out, b.out)
    # sequence 2 alone (its own batch) gives the same bits as inside the mixed batch
    alone = attnops.RaggedBatch(np.array([0, 1], np.int32), np.array([1300]), batch.page_table[2:3])
    c = OP.paged(q[cu[2]:cu[3]], cache, alone, backend="cpu", kv_split_tokens=256)
    np.testing.assert_array_equal(c.out, a.out[cu[2]:cu[3]])
    assert OP.explain_paged(q, cache, plan, backend="cpu")["backend"] == "cpu"


def test_a_plan_carries_its_options():
    rng = np.random.default_rng(11)
    cache, batch, q, dense, cu = make_batch(rng, [1, 4], [40, 9], 16, 8, 4, 2, 16, 16, "f32")
    sinks = rng.uniform(-1, 1, 4).astype(np.float32)
    opts = dict(sliding_window=(5, 0), logits_soft_cap=3.0, sinks=sinks, return_lse=True)
    plan = attnops.plan_paged(batch, cache, num_tokens=len(q), num_q_heads=4, **opts)
    bare = OP.paged(q, cache, plan)  # the plan's options: no keyword repeated
    full = OP.paged(q, cache, plan, **opts)
    assert bare.lse is not None
    np.testing.assert_array_equal(bare.out, full.out)
    np.testing.assert_array_equal(bare.lse, full.lse)
    sinks[:] = 40.0  # the plan kept a copy
    np.testing.assert_array_equal(OP.paged(q, cache, plan).out, full.out)
    assert OP.explain_paged(q, cache, plan)["operator"] == "ragged_paged"
    with pytest.raises(attnops.InvalidArgument, match="paged\\(q, cache, plan\\)"):
        OP.paged(q, cache, plan, sliding_window=(2, 0))


def test_wrap_views_the_callers_pools_and_write_gather_round_trip():
    k_pages = np.zeros((8, 4, 2, 6), np.float32)
    v_pages = np.zeros((8, 4, 2, 5), np.float32)
    cache = attnops.PagedKVCache.wrap(k_pages, v_pages)
    assert cache.k_pages is k_pages and cache.spec["head_dim_v"] == 5 and not cache.on_device
    rng = np.random.default_rng(3)
    k_new = rng.standard_normal((3, 2, 6)).astype(np.float32)
    v_new = rng.standard_normal((3, 2, 5)).astype(np.float32)
    cache.write(k_new, v_new, np.array([13, -1, 2], np.int64))   # the -1 row is skipped
    np.testing.assert_array_equal(k_pages[3, 1], k_new[0])          # slot 13 = page 3, row 1
    np.testing.assert_array_equal(v_pages[0, 2], v_new[2])
    k, v = cache.gather(np.array([0, 3], np.int32), 6)
    assert k.shape == (1, 6, 2, 6) and v.shape == (1, 6, 2, 5)
    np.testing.assert_array_equal(k[0, 2], k_new[2])
    np.testing.assert_array_equal(k[0, 5], k_new[0])
    # a host cache exposes its pools as arrays over its own memory
    own = attnops.PagedKVCache.host(2, 2, 1, 3)
    own.write(np.ones((1, 1, 3), np.float32), np.ones((1, 1, 3), np.float32), np.array([3], np.int32))
    assert own.k_pages.shape == (2, 2, 1, 3) and own.k_pages[1, 1, 0, 2] == 1.0 and own.k_pages.sum() == 3.0


def test_merge_states_of_two_halves_is_the_whole():
    rng = np.random.default_rng(11)
    q = rng.uniform(-1, 1, (1, 3, 2, 8)).astype(np.float32)
    k = rng.uniform(-1, 1, (1, 20, 2, 8)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, 20, 2, 8)).astype(np.float32)
    dense = attnops.registry().get("flash_attn2")
    halves = [dense(q, k[:, a:b], v[:, a:b], causal=False, return_lse=True, backend="cpu") for a, b in ((0, 7), (7, 20))]
    whole = dense(q, k, v, causal=False, return_lse=True, backend="cpu")
    # states are [N, H, Dv] / [N, H]: one batch's rows, lse transposed from [B, H, T]
    out, lse = attnops.merge_states(halves[0].out[0], halves[0].lse[0].T.copy(), halves[1].out[0],
                                    halves[1].lse[0].T.copy())
    np.testing.assert_allclose(out, whole.out[0], atol=2e-6)
    np.testing.assert_allclose(lse, whole.lse[0].T, atol=2e-6)


def test_bad_input_is_a_typed_error_naming_the_argument_and_writes_nothing():
    cache = attnops.PagedKVCache.host(4, 4, 1, 8)
    before = cache.k_pages.copy()
    k = np.ones((2, 1, 8), np.float32)
    with pytest.raises(attnops.InvalidArgument, match="slot"):
        cache.write(k, k, np.array([1, 16], np.int32))               # slot 16 is past the pool
    np.testing.assert_array_equal(cache.k_pages, before)             # all or nothing
    with pytest.raises(attnops.InvalidArgument, match="slot"):
        cache.write(k, k, np.array([5, 5], np.int32))                # one slot written twice
    q = np.ones((2, 2, 8), np.float32)
    bad_cu = attnops.RaggedBatch(np.array([0, 3], np.int32), np.array([4], np.int32), np.zeros((1, 1), np.int32))
    with pytest.raises(attnops.Error, match="cu_seqlens_q"):
        OP.paged(q, cache, bad_cu)
    wide = attnops.RaggedBatch(np.array([0, 2], np.int32), np.array([9], np.int32), np.zeros((1, 2), np.int32))
    with pytest.raises(attnops.Error, match="page_table"):
        OP.paged(q, cache, wide)                                      # 9 keys need 3 pages of 4
    ok = attnops.RaggedBatch(np.array([0, 2], np.int32), np.array([4], np.int32), np.zeros((1, 1), np.int32))
    with pytest.raises(attnops.InvalidArgument, match="bias"):
        OP.paged(q, cache, ok, bias=np.zeros((1, 2, 2, 4), np.float32))
    with pytest.raises(TypeError, match="RaggedBatch"):
        OP.paged(q, cache, (1, 2))
    with pytest.raises(TypeError, match="PagedKVCache"):
        OP.paged(q, "cache", ok)


def read_only_pools(shape):
    """Arrays a cache cannot write into: a read-only copy, a bytes buffer, a broadcast view."""
    n = int(np.prod(shape))
    frozen = np.zeros(shape, np.float32)
    frozen.flags.writeable = False
    return {
        "flag": frozen,
        "bytes": np.frombuffer(bytes(4 * n), np.float32).reshape(shape),
        "memoryview": memoryview(bytes(4 * n)).cast("B").cast("f", list(shape)),
        "broadcast_to": np.broadcast_to(np.float32(0), shape),
    }


def test_wrap_refuses_read_only_pools_naming_them():
    shape = (4, 2, 1, 4)
    ok = np.zeros(shape, np.float32)
    for pool in read_only_pools(shape).values():
        with pytest.raises(attnops.InvalidArgument, match="k_pages.*read-only"):
            attnops.PagedKVCache.wrap(pool, ok)
        with pytest.raises(attnops.InvalidArgument, match="v_pages.*read-only"):
            attnops.PagedKVCache.wrap(ok, pool)
    # a read-only memory map crashed the interpreter at write(); in a child, so that a crash is a failure
    child = """
import sys, numpy as np, attnops
np.save(sys.argv[1], np.zeros((4, 2, 1, 4), np.float32))
k = np.load(sys.argv[1], mmap_mode="r")
try:
    cache = attnops.PagedKVCache.wrap(k, np.zeros((4, 2, 1, 4), np.float32))
    cache.write(np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32), np.array([0]))
    print("written")
except attnops.InvalidArgument as e:
    print("refused:", e)
"""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", child, os.path.join(d, "k.npy")], capture_output=True, text=True,
                           env=dict(os.environ), timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.startswith("refused: k_pages"), r.stdout + r.stderr


def test_paged_arguments_out_of_range_or_of_the_wrong_type_are_typed_errors():
    cache = attnops.PagedKVCache.host(4, 4, 1, 8)
    row = np.array([0, 1], np.int32)
    for kv_len in (2**63 - 1, 2**40 + 1):
        with pytest.raises(attnops.InvalidArgument, match="^kv_len"):
            cache.gather(row, kv_len)
    q = np.ones((2, 2, 8), np.float32)
    batch = attnops.RaggedBatch(np.array([0, 2], np.int32), np.array([4], np.int32), np.zeros((1, 1), np.int32))
    for bad in ("16", 16.0, [16]):
        with pytest.raises(TypeError, match="kv_split_tokens"):
            OP.paged(q, cache, batch, kv_split_tokens=bad)
        with pytest.raises(TypeError, match="kv_split_tokens"):
            attnops.plan_paged(batch, cache, num_tokens=2, num_q_heads=2, kv_split_tokens=bad)
    assert OP.paged(q, cache, batch, kv_split_tokens=np.int64(16)).out.shape == (2, 2, 8)
    minus5 = attnops.RaggedBatch(np.array([0, 2], np.int32), np.array([4], np.int32), np.zeros((1, 1), np.int32),
                                 num_seqs=-5)
    with pytest.raises(attnops.InvalidArgument, match="num_seqs"):
        OP.paged(q, cache, minus5)
    with pytest.raises(attnops.InvalidArgument, match="num_seqs"):
        attnops.plan_paged(minus5, cache, num_tokens=2, num_q_heads=2)


def quantize_int8_per_token(x):
    """kv_quant.h's int8 rounding per (row, head): scale amax / 127 (1 for a row of zeros), rint."""
    amax = np.abs(x).max(axis=-1, keepdims=True).astype(np.float32)
    s = (amax / np.float32(127)).astype(np.float32)
    s = np.where(s >= np.finfo(np.float32).tiny, s, np.float32(1))
    q = np.clip(np.rint((x / s).astype(np.float32)), -127, 127).astype(np.int8)
    return q, s[..., 0]


@pytest.mark.parametrize("backend", ["native", "cpu"])
@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("scales", ["per_token", "per_tensor"])
def test_eight_bit_caches_attend_over_their_values(backend, kv_dtype, scales):
    rng = np.random.default_rng(7)
    hq, hkv, d, page = 4, 2, 16, 4
    kw = dict(k_scale=0.01, v_scale=0.02) if scales == "per_tensor" else {}
    cache = attnops.PagedKVCache.host(8, page, hkv, d, dtype=kv_dtype, scales=scales, **kw)
    assert cache.spec["dtype"] == kv_dtype and cache.spec["scales"] == scales
    assert cache.k_pages.dtype == (np.int8 if kv_dtype == "int8" else np.uint8)
    kv = 13
    k = rng.normal(size=(kv, hkv, d)).astype(np.float32)
    v = rng.normal(size=(kv, hkv, d)).astype(np.float32)
    pages = np.array([[5, 2, 7, 0]], np.int32)
    j = np.arange(kv)
    cache.write(k, v, pages[0, j // page].astype(np.int64) * page + j % page)
    gk, gv = cache.gather(pages[0], kv)
    assert gk.dtype == np.float32 and gk.shape == (1, kv, hkv, d)
    if kv_dtype == "int8" and scales == "per_token":  # the documented rounding, from numpy
        qk, sk = quantize_int8_per_token(k)
        np.testing.assert_array_equal(gk[0], qk.astype(np.float32) * sk[..., None])
        np.testing.assert_array_equal(cache.k_scales[pages[0, j // page], j % page], sk)
    q = rng.uniform(-1, 1, (3, hq, d)).astype(np.float32)
    batch = attnops.RaggedBatch(np.array([0, 3], np.int32), np.array([kv], np.int32), pages)
    res = OP.paged(q, cache, batch, return_lse=True, backend=backend)
    o, lse, _ = ref.attention(q[None].astype(np.float64), gk.astype(np.float64), gv.astype(np.float64))
    np.testing.assert_allclose(res.out, o[0], atol=ref.TOLERANCE["f32"][0] * 4, rtol=0)
    np.testing.assert_allclose(res.lse, lse[0].T, atol=ref.TOLERANCE["f32"][1] * 4, rtol=0)

    # The same pools and scales wrapped: the same result, bit for bit.
    w = attnops.PagedKVCache.wrap(cache.k_pages, cache.v_pages, dtype=kv_dtype,
                                  k_scales=cache.k_scales, v_scales=cache.v_scales)
    again = OP.paged(q, w, batch, return_lse=True, backend=backend)
    np.testing.assert_array_equal(again.out, res.out)


def test_eight_bit_bad_input_is_typed():
    k = np.zeros((2, 4, 1, 8), np.int8)
    with pytest.raises(attnops.InvalidArgument, match="k_scales"):
        attnops.PagedKVCache.wrap(k, k)
    bad = np.ones((2, 4, 1), np.float32)
    bad[1, 2, 0] = 0.0
    with pytest.raises(attnops.InvalidArgument, match=r"k_scales: scale \[1, 2, 0\]"):
        attnops.PagedKVCache.wrap(k, k, k_scales=bad, v_scales=np.ones((2, 4, 1), np.float32))
    with pytest.raises(attnops.InvalidArgument, match="tensor_scales"):
        attnops.PagedKVCache.host(2, 4, 1, 8, dtype="int8", k_scale=0.5, v_scale=0.5)
    cache = attnops.PagedKVCache.host(2, 4, 1, 8, dtype="int8")
    rows = np.zeros((1, 1, 8), np.float32)
    rows[0, 0, 3] = np.nan
    with pytest.raises(attnops.InvalidArgument, match="k_new: row 0"):
        cache.write(rows, np.zeros((1, 1, 8), np.float32), np.array([0], np.int32))


def test_eight_bit_pools_and_scales_of_the_wrong_dtype_are_typed():
    ones = np.ones((2, 4, 1), np.float32)
    codes = np.zeros((2, 4, 1, 8), np.int8)
    floats = np.zeros((2, 4, 1, 8), np.float32)
    # dtype= names what the arrays hold: float pools are no int8 or e4m3 codes (a float32 array
    # viewed as bytes would be read as 4x as many codes).
    with pytest.raises(attnops.UnsupportedDtype, match="k_pages"):
        attnops.PagedKVCache.wrap(floats, floats, dtype="int8", k_scales=ones, v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="k_pages.*uint8"):
        attnops.PagedKVCache.wrap(floats, floats, dtype="fp8_e4m3", k_scales=ones, v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="v_pages"):
        attnops.PagedKVCache.wrap(codes.view(np.uint8), codes.astype(np.float16), dtype="fp8_e4m3",
                                  k_scales=ones, v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="k_pages.*fp8_e4m3"):  # uint8 without dtype=
        attnops.PagedKVCache.wrap(codes.view(np.uint8), codes.view(np.uint8), k_scales=ones, v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="v_pages"):  # int8 keys, float values
        attnops.PagedKVCache.wrap(codes, floats, k_scales=ones, v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="k_scales"):
        attnops.PagedKVCache.wrap(codes, codes, k_scales=ones.astype(np.float64), v_scales=ones)
    with pytest.raises(attnops.UnsupportedDtype, match="v_scales"):
        attnops.PagedKVCache.wrap(codes, codes, k_scales=ones, v_scales=ones.astype(np.float16))
    with pytest.raises(attnops.ShapeMismatch, match="k_scales"):
        attnops.PagedKVCache.wrap(codes, codes, k_scales=np.ones((3, 4, 1), np.float32), v_scales=ones)
    with pytest.raises(attnops.InvalidArgument, match="v_scales.*per token"):
        attnops.PagedKVCache.wrap(codes, codes, k_scales=ones, v_scales=np.ones(1, np.float32))
    with pytest.raises(attnops.InvalidArgument, match="k_scales"):
        attnops.PagedKVCache.host(2, 4, 1, 8, dtype="int8", scales="per_tensor", k_scale=-1.0, v_scale=1.0)
    with pytest.raises(attnops.InvalidArgument, match="v_scales"):
        attnops.PagedKVCache.host(2, 4, 1, 8, dtype="fp8_e4m3", scales="per_tensor", k_scale=1.0,
                                  v_scale=float("nan"))
    cache = attnops.PagedKVCache.host(2, 4, 1, 8, dtype="int8")
    q = np.zeros((1, 1, 8), np.float32)
    batch = attnops.RaggedBatch(np.array([0, 1], np.int32), np.array([1], np.int32), np.array([[0]], np.int32))
    with pytest.raises(TypeError, match="share_prefixes"):
        OP.paged(q, cache, batch, share_prefixes="yes")


def test_shared_prefixes_change_no_bit():
    rng = np.random.default_rng(3)
    hq, hkv, d, page = 4, 2, 16, 8
    cache = attnops.PagedKVCache.host(32, page, hkv, d)
    shared = np.arange(4, dtype=np.int32)  # 32 keys in pages 0..3, then each sequence's own
    table = np.stack([np.concatenate([shared, [10 + 3 * s, 11 + 3 * s, 12 + 3 * s]]) for s in range(3)])
    kv_lens = np.array([40, 50, 45], np.int32)
    slots = np.arange(32 * page, dtype=np.int64)
    cache.write(rng.uniform(-1, 1, (32 * page, hkv, d)).astype(np.float32),
                rng.uniform(-1, 1, (32 * page, hkv, d)).astype(np.float32), slots)
    q = rng.uniform(-1, 1, (3, hq, d)).astype(np.float32)
    batch = attnops.RaggedBatch(np.arange(4, dtype=np.int32), kv_lens, table.astype(np.int32))
    on = OP.paged(q, cache, batch, return_lse=True, backend="cpu", kv_split_tokens=16)
    off = OP.paged(q, cache, batch, return_lse=True, backend="cpu", kv_split_tokens=16, share_prefixes=False)
    assert on.decision["shared_keys"] == 32 and "shared_keys" not in off.decision
    np.testing.assert_array_equal(on.out, off.out)
    np.testing.assert_array_equal(on.lse, off.lse)
