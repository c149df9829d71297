"""A float64 numpy reference of attnops' semantics (README, Semantics), written independently of
the library (masks are evaluated from their definitions, not through Mask.visible), plus the
helpers the tests share: random inputs per dtype, bf16 bit conversions and tolerances."""

import numpy as np

# Per storage dtype: (out, lse) absolute tolerances for inputs in [-1, 1] (the C++ tests' values,
# tests/support/testing.cpp).
TOLERANCE = {"f32": (2e-5, 1e-4), "f16": (2e-3, 1e-3), "bf16": (1.6e-2, 1e-3)}


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16), as attnops does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(x, dtype):
    """float32 array -> the array attnops is given for `dtype` (bf16: uint16 bits)."""
    if dtype == "f32":
        return x.astype(np.float32)
    if dtype == "f16":
        return x.astype(np.float16)
    return f32_to_bf16_bits(x)


def to_f64(x, dtype):
    """What attnops reads from a storage array, as float64 (the reference's input)."""
    if dtype == "bf16":
        return bf16_bits_to_f32(x).astype(np.float64)
    return np.asarray(x).astype(np.float64)


def random_inputs(rng, b, tq, tk, hq, hkv, d, dv, dtype, scale=1.0):
    q = to_storage(rng.uniform(-scale, scale, (b, tq, hq, d)).astype(np.float32), dtype)
    k = to_storage(rng.uniform(-scale, scale, (b, tk, hkv, d)).astype(np.float32), dtype)
    v = to_storage(rng.uniform(-scale, scale, (b, tk, hkv, dv)).astype(np.float32), dtype)
    return q, k, v


class MaskSpec:
    """A mask as its definition (numpy), mirroring an attnops.Mask built alongside it."""

    def __init__(self, kind, *args):
        self.kind, self.args = kind, args

    def visible(self, hq, tq, tk):
        """bool [Hq or 1, Tq, Tk]; rows aligned bottom-right (p = i + Tk - Tq)."""
        i = np.arange(tq)[:, None]
        j = np.arange(tk)[None, :]
        p = i + (tk - tq)
        k, a = self.kind, self.args
        if k == "full":
            m = np.ones((tq, tk), bool)
        elif k == "causal":
            m = j <= p
        elif k == "local":
            m = (j >= p - a[0]) & (j <= p + a[1])
        elif k == "chunked_causal":
            m = (j <= p) & (np.floor_divide(j, a[0]) == np.floor_divide(p, a[0]))
        elif k == "per_head":
            return np.stack([c.visible(hq, tq, tk)[0] for c in a])
        elif k == "and":
            return a[0].visible(hq, tq, tk) & a[1].visible(hq, tq, tk)
        elif k == "or":
            return a[0].visible(hq, tq, tk) | a[1].visible(hq, tq, tk)
        else:
            raise ValueError(k)
        return np.broadcast_to(m, (1, tq, tk))

    def __and__(self, other):
        return MaskSpec("and", self, other)

    def __or__(self, other):
        return MaskSpec("or", self, other)


def attention(
    q,
    k,
    v,
    *,
    causal=True,
    sliding_window=None,
    chunk_size=None,
    segment_ids_q=None,
    segment_ids_kv=None,
    bias=None,
    logits_soft_cap=None,
    sinks=None,
    mask=None,
    softmax_scale=None,
):
    """float64 (out [B, Tq, Hq, Dv], lse [B, Hq, Tq], probs [B, Hq, Tq, Tk]); mask: a MaskSpec."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else softmax_scale
    kk = np.repeat(k, g, axis=2)
    vv = np.repeat(v, g, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * np.tanh(s / logits_soft_cap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    i = np.arange(tq)[:, None]
    j = np.arange(tk)[None, :]
    p = i + (tk - tq)
    vis = np.ones((b, hq, tq, tk), bool)
    if causal:
        vis &= j <= p
    if sliding_window is not None:
        left, right = sliding_window
        vis &= (j >= p - left) & (j <= p + right)
    if chunk_size is not None:
        vis &= (j <= p) & (np.floor_divide(j, chunk_size) == np.floor_divide(p, chunk_size))
    if mask is not None:
        vis &= mask.visible(hq, tq, tk)[None]
    if segment_ids_q is not None:
        vis &= (np.asarray(segment_ids_q)[:, :, None] == np.asarray(segment_ids_kv)[:, None, :])[:, None]
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, :, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m[..., None]), 0.0)
    total = e.sum(axis=-1)
    denom = total + (np.exp(np.asarray(sinks, np.float64)[None, :, None] - m) if sinks is not None else 0.0)
    probs = e / np.where(denom > 0, denom, 1.0)[..., None]
    out = np.einsum("bhij,bjhd->bihd", probs, vv)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + m, -np.inf)
    return out, lse, probs
