"""Each operator x backend (native, cpu, gpu on lavapipe) x dtype against the float64 numpy
reference (reference.py), over masks (causal, sliding window, chunked, attnops.Mask objects),
GQA / MQA, sinks, soft cap, bias (broadcast), segment ids, fully masked rows, Dv != D, Tq != Tk
and decode (Tq = 1). Inputs in [-1, 1]; tolerances per dtype as the C++ tests'."""

import numpy as np
import pytest

import attnops
import reference as ref
from conftest import BACKENDS, DTYPES, OPERATORS, operator, skip_without

M = attnops.Mask
S = ref.MaskSpec

# (name, shape (B, Tq, Tk, Hq, Hkv, D, Dv), options, reference options); "sinks_cap_bias" and
# "segments" make their option arrays in build()
SCENARIOS = [
    ("causal_gqa_dv", (2, 19, 23, 4, 2, 24, 40), {}, {}),
    ("noncausal_mqa", (1, 33, 17, 4, 1, 16, 16), {"causal": False}, {"causal": False}),
    ("window_chunk", (1, 40, 40, 2, 2, 20, 12), {"sliding_window": (7, 2), "chunk_size": 16},
     {"sliding_window": (7, 2), "chunk_size": 16}),
    ("mask_objects", (1, 24, 30, 2, 1, 8, 8),
     {"causal": False, "mask": M.per_head([M.causal() & M.local(5, 0), M.chunked_causal(8) | M.local(0, 3)])},
     {"causal": False, "mask": S("per_head", S("causal") & S("local", 5, 0), S("chunked_causal", 8) | S("local", 0, 3))}),
    ("sinks_cap_bias", (2, 18, 18, 4, 2, 16, 16), "sinks_cap_bias", None),
    ("segments_masked_rows", (2, 20, 20, 2, 2, 8, 8), "segments", None),
    ("decode", (2, 1, 37, 4, 2, 32, 32), {}, {}),
]


def build(name, shape, opts, ref_opts, dtype, rng):
    b, tq, tk, hq, hkv, d, dv = shape
    q, k, v = ref.random_inputs(rng, b, tq, tk, hq, hkv, d, dv, dtype)
    if opts == "sinks_cap_bias":
        sinks = rng.uniform(-1, 1, hq).astype(np.float32)
        bias = rng.uniform(-1, 1, (1, hq, tq, tk)).astype(np.float32)  # broadcast over B
        opts = {"sinks": sinks, "bias": bias, "logits_soft_cap": 0.5}
        ref_opts = {"sinks": sinks, "bias": bias, "logits_soft_cap": 0.5}
    elif opts == "segments":
        seg_q = np.repeat(np.arange(4, dtype=np.int32), 5)[None].repeat(b, 0)
        seg_kv = np.repeat(np.arange(1, 5, dtype=np.int64), 5)[None].repeat(b, 0)  # i64 is accepted
        # q segment 0 has no key: rows 0..4 are fully masked (out 0, lse -inf)
        opts = {"segment_ids_q": seg_q, "segment_ids_kv": seg_kv}
        ref_opts = dict(opts)
    return (q, k, v), opts, ref_opts


def check(res, inputs, ref_opts, dtype, weights=False):
    q, k, v = (ref.to_f64(x, dtype) for x in inputs)
    out_ref, lse_ref, probs_ref = ref.attention(q, k, v, **ref_opts)
    out = ref.to_f64(res.out, dtype)
    tol_out, tol_lse = ref.TOLERANCE[dtype]
    assert out.shape == out_ref.shape
    np.testing.assert_allclose(out, out_ref, rtol=0, atol=tol_out)
    assert res.lse.dtype == np.float32 and res.lse.shape == lse_ref.shape
    assert np.array_equal(np.isneginf(res.lse), np.isneginf(lse_ref))  # fully masked rows
    finite = np.isfinite(lse_ref)
    np.testing.assert_allclose(res.lse[finite], lse_ref[finite], rtol=0, atol=tol_lse)
    if weights:
        np.testing.assert_allclose(res.weights, probs_ref, rtol=0, atol=tol_out)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op_name", OPERATORS)
def test_matches_float64_reference(op_name, backend, dtype, scenario):
    skip_without(backend)
    name, shape, opts, ref_opts = scenario
    rng = np.random.default_rng(abs(hash((op_name, backend, dtype, name))) % 2**32)
    inputs, opts, ref_opts = build(name, shape, opts, ref_opts, dtype, rng)
    op = operator(op_name)
    want_weights = op_name == "vanilla" and backend != "gpu"
    res = op(*inputs, backend=backend, dtype="bf16" if dtype == "bf16" else None, return_lse=True,
             return_weights=want_weights, **opts)
    d = res.decision
    assert (d["operator"], d["backend"]) == (op_name, backend), d
    assert d["bytes_copied"] == 0 or (name == "segments_masked_rows" and d["bytes_copied"] > 0)
    assert res.out.dtype == {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dtype]
    check(res, inputs, ref_opts, dtype, weights=want_weights)


@pytest.mark.parametrize("op_name", OPERATORS)
def test_runtime_dtype_converts_and_scale(op_name):
    # f32 inputs run in bf16 (runtime_dtype): the output is bf16 (uint16 for numpy); softmax_scale.
    rng = np.random.default_rng(7)
    q, k, v = ref.random_inputs(rng, 1, 16, 16, 2, 2, 16, 16, "f32")
    res = operator(op_name)(q, k, v, backend="cpu", runtime_dtype="bf16", softmax_scale=0.3, return_lse=True)
    assert res.out.dtype == np.uint16
    assert res.decision["bytes_copied"] == 3 * q.size * 2  # q, k, v converted to bf16 copies
    qb, kb, vb = (ref.bf16_bits_to_f32(ref.f32_to_bf16_bits(x)) for x in (q, k, v))
    out_ref, lse_ref, _ = ref.attention(qb, kb, vb, softmax_scale=0.3)
    np.testing.assert_allclose(ref.bf16_bits_to_f32(res.out), out_ref, atol=1.6e-2, rtol=0)
    np.testing.assert_allclose(res.lse, lse_ref, atol=1e-3, rtol=0)
