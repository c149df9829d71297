"""PyTorch integration (imported only when used: ``import attnops.torch`` or ``attnops.torch``).

    import torch, attnops.torch
    q = torch.randn(2, 128, 8, 64, requires_grad=True)     # BTHD: [B, Tq, Hq, D], CPU
    out = attnops.torch.attention(q, k, v, op="flash_attn2", causal=True, sinks=s, bias=b)
    out.sum().backward()                                     # q.grad, k.grad, v.grad, s.grad, b.grad

The forward runs the attnops operator on the tensors' memory (DLPack, no copy, no link to
libtorch), keeps out and lse, and the backward calls the library's backward (attnops::Attention::
backward: the FlashAttention-2 backward of the same operator and backend order). Differentiable in
q, k, v, sinks and bias; segment ids, masks and the scale get no gradient. Works with PyTorch
1.13 (Debian 12) and later: an autograd.Function, no torch.library registration.

reference_attention() is the same semantics in plain PyTorch operations (any dtype; autograd),
for tests and comparisons (PyTorch 1.13 has no scaled_dot_product_attention).
"""

import functools
import math

import torch as _torch

import attnops as _attnops

__all__ = ["attention", "AttentionFunction", "reference_attention"]


@functools.lru_cache(maxsize=64)
def _operator_by_name(name):
    return _attnops.registry().get(name)


def _operator(op, config):
    if isinstance(op, _attnops.Operator):  # the package's Operator (attnops/_operator.py)
        if config is not None:
            raise TypeError("attention: config= applies to an operator given by name")
        return op
    if config is None:
        return _operator_by_name(op)
    return _attnops.registry().get(op, config=config)


class AttentionFunction(_torch.autograd.Function):
    """apply(q, k, v, sinks, bias, op, options) -> (out, lse); lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, op, options):
        # Inputs that require grad are detached by the binding (a view, no copy).
        res = op(q, k, v, sinks=sinks, bias=bias, return_lse=True, **options)
        out, lse = res.out, res.lse
        ctx.op = op
        ctx.options = options
        ctx.save_for_backward(q, k, v, out, lse, sinks, bias)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @_torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sinks, bias = ctx.saved_tensors
        g = ctx.op.backward(q, k, v, out, lse, dout, sinks=sinks, bias=bias, **ctx.options)
        need = ctx.needs_input_grad

        def cast(grad, like, i):
            return grad.to(like.dtype) if need[i] and grad is not None else None

        return (
            cast(g.dq, q, 0),
            cast(g.dk, k, 1),
            cast(g.dv, v, 2),
            cast(g.dsinks, sinks, 3) if sinks is not None else None,
            cast(g.dbias, bias, 4) if bias is not None else None,
            None,
            None,
        )


def attention(q, k, v, op="blocksparse", *, config=None, sinks=None, bias=None, return_lse=False, **options):
    """Differentiable attention over torch CPU tensors (BTHD: q [B, Tq, Hq, D], k [B, Tk, Hkv, D],
    v [B, Tk, Hkv, Dv]; float32, float16 or bfloat16).

    op: a registry name or alias ("vanilla", "blocksparse"/"splash", "flash_attn2"/"flash") or an
    attnops.Operator; config: a YAML path or dict (with op given by name). sinks [Hq] and bias
    [B|1, Hq|1, Tq, Tk] receive gradients. Other keywords: those of attnops.Operator.__call__
    (causal=True, sliding_window, chunk_size, segment_ids_q, segment_ids_kv, logits_soft_cap,
    mask, backend, softmax_scale, runtime_dtype, num_threads). Returns out, or (out, lse) with
    return_lse=True (lse [B, Hq, Tq] float32, not differentiable).
    """
    if options.pop("return_weights", False):
        raise TypeError("attention: return_weights is not differentiable; call the operator itself")
    out, lse = AttentionFunction.apply(q, k, v, sinks, bias, _operator(op, config), options)
    return (out, lse) if return_lse else out


def _mask_tensor(mask, hq, tq, tk, device):
    """attnops.Mask as a bool tensor broadcastable to [Hq, Tq, Tk] (rows aligned bottom-right)."""
    i = _torch.arange(tq, device=device)[:, None]
    j = _torch.arange(tk, device=device)[None, :]
    p = i + (tk - tq)

    def evaluate(m):
        kind = m.kind
        if kind == "full":
            return _torch.ones(1, 1, dtype=_torch.bool, device=device)
        if kind == "causal":
            return j <= p
        if kind == "local":
            return (j >= p - m.left) & (j <= p + m.right)
        if kind == "chunked_causal":
            c = m.chunk
            return (j <= p) & (_torch.div(j, c, rounding_mode="floor") == _torch.div(p, c, rounding_mode="floor"))
        if kind == "per_head":
            return _torch.stack([evaluate(c).expand(tq, tk) for c in m.children])
        parts = [evaluate(c) for c in m.children]
        result = parts[0]
        for part in parts[1:]:
            result = (result & part) if kind == "all_of" else (result | part)
        return result

    return evaluate(mask)


def reference_attention(
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
    """attnops' semantics (README, Semantics) in PyTorch operations, in q's dtype: (out, lse).
    Differentiable by autograd; a fully masked row gives out 0 and lse -inf, and no NaN gradient."""
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    kk = k.repeat_interleave(group, dim=2) if group > 1 else k
    vv = v.repeat_interleave(group, dim=2) if group > 1 else v
    s = _torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    if logits_soft_cap is not None:
        s = logits_soft_cap * _torch.tanh(s / logits_soft_cap)
    if bias is not None:
        s = s + bias
    i = _torch.arange(tq, device=q.device)[:, None]
    j = _torch.arange(tk, device=q.device)[None, :]
    p = i + (tk - tq)
    visible = _torch.ones(tq, tk, dtype=_torch.bool, device=q.device)
    if causal:
        visible = visible & (j <= p)
    if sliding_window is not None:
        left, right = (sliding_window, 0) if isinstance(sliding_window, int) else sliding_window
        visible = visible & (j >= p - left) & (j <= p + right)
    if chunk_size is not None:
        c = chunk_size
        visible = visible & (j <= p) & (_torch.div(j, c, rounding_mode="floor") == _torch.div(p, c, rounding_mode="floor"))
    visible = visible.expand(b, hq, tq, tk)
    if mask is not None:
        visible = visible & _mask_tensor(mask, hq, tq, tk, q.device)
    if segment_ids_q is not None:
        same = segment_ids_q.to(_torch.int64)[:, :, None] == segment_ids_kv.to(_torch.int64)[:, None, :]
        visible = visible & same[:, None]
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to(s.dtype).reshape(1, hq, 1, 1).expand(b, hq, tq, 1)
        logits = _torch.cat([s, sink], dim=-1)
    else:
        logits = s
    m = logits.amax(dim=-1, keepdim=True).detach()
    m = _torch.where(_torch.isfinite(m), m, _torch.zeros_like(m))
    e = _torch.exp(logits - m)
    denom = e.sum(dim=-1, keepdim=True)
    probs = e[..., :tk] / _torch.where(denom > 0, denom, _torch.ones_like(denom))
    out = _torch.einsum("bhij,bjhd->bihd", probs, vv)
    visible_sum = e[..., :tk].sum(dim=-1)
    lse = _torch.where(
        visible_sum > 0,
        _torch.log(_torch.where(visible_sum > 0, visible_sum, _torch.ones_like(visible_sum))) + m[..., 0],
        _torch.full_like(visible_sum, float("-inf")),
    )
    return out, lse
