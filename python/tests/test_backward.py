"""Gradients: attnops.torch.attention (an autograd.Function over the library's backward) against
PyTorch autograd through the float64 reference of the same semantics
(attnops.torch.reference_attention, itself checked against the numpy reference and by
gradcheck), per operator x backend x dtype, over GQA, sinks, bias, soft cap, segment ids with
fully masked rows, windows and Mask objects; op.backward on numpy arrays; gradcheck of the
attnops function itself (float32 kernels, so at float32 step and tolerances).
Tolerance: max |got - want| <= tol * max(1, max |want|) per gradient (tests/backward's values)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnops  # noqa: E402
import attnops.torch as at  # noqa: E402
import reference as ref  # noqa: E402
from conftest import BACKENDS, DTYPES, OPERATORS, operator, skip_without  # noqa: E402

TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
GRAD_TOL = {"f32": 4e-5, "f16": 4e-3, "bf16": 2.5e-2}
M = attnops.Mask


def scenario_inputs(name, dtype, gen):
    """Leaf tensors (float64 values exactly representable in `dtype`) and the options."""

    def rand(*shape):
        x = torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1
        return x.to(TORCH_DTYPE[dtype]).to(torch.float64)

    if name == "gqa_sinks_bias_cap":
        b, tq, tk, hq, hkv, d, dv = 2, 17, 21, 4, 2, 16, 24
        extra = {"sinks": rand(hq), "bias": rand(b, 1, tq, tk)}  # bias broadcast over heads
        opts = {"logits_soft_cap": 0.8}
    elif name == "segments_window":
        b, tq, tk, hq, hkv, d, dv = 1, 20, 20, 2, 1, 8, 8
        seg_q = torch.arange(20).div(5, rounding_mode="floor")[None].to(torch.int32)
        seg_kv = (torch.arange(20).div(5, rounding_mode="floor") + 1)[None].to(torch.int32)  # rows 0..4 see nothing
        extra = {"sinks": rand(hq)}
        opts = {"causal": False, "sliding_window": (6, 3), "segment_ids_q": seg_q, "segment_ids_kv": seg_kv}
    else:  # mask objects, decode-like short q against a longer cache
        b, tq, tk, hq, hkv, d, dv = 1, 9, 30, 2, 2, 12, 12
        extra = {"bias": rand(1, hq, tq, tk)}
        opts = {"causal": False, "mask": M.per_head([M.causal() & M.local(6, 0), M.chunked_causal(8)])}
    q, k, v = rand(b, tq, hq, d), rand(b, tk, hkv, d), rand(b, tk, hkv, dv)
    dout = rand(b, tq, hq, dv)
    return (q, k, v), extra, opts, dout


SCENARIOS = ("gqa_sinks_bias_cap", "segments_window", "mask_objects")


def reference_grads(inputs, extra, opts, dout):
    leaves = [x.clone().requires_grad_() for x in inputs]
    ex = {key: x.clone().requires_grad_() for key, x in extra.items()}
    out, _ = at.reference_attention(*leaves, **ex, **opts)
    (out * dout).sum().backward()
    return out.detach(), [x.grad for x in leaves] + [ex[key].grad for key in sorted(ex)]


def assert_grads_close(got, want, tol, names):
    for g, w, name in zip(got, want, names):
        assert g is not None, name
        assert torch.isfinite(g).all(), name
        scale = max(1.0, w.abs().max().item())
        err = (g.to(torch.float64) - w).abs().max().item()
        assert err <= tol * scale, f"{name}: max err {err} > {tol} * {scale}"


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op_name", OPERATORS)
def test_gradients_match_float64_autograd(op_name, backend, dtype, scenario):
    skip_without(backend)
    gen = torch.Generator().manual_seed(abs(hash((op_name, backend, dtype, scenario))) % 2**31)
    inputs, extra, opts, dout = scenario_inputs(scenario, dtype, gen)
    out_ref, want = reference_grads(inputs, extra, opts, dout)

    td = TORCH_DTYPE[dtype]
    leaves = [x.to(td).requires_grad_() for x in inputs]
    ex = {key: x.to(torch.float32).requires_grad_() for key, x in extra.items()}
    out = at.attention(*leaves, op=operator(op_name), backend=backend, **ex, **opts)
    assert out.dtype == td
    (out * dout.to(td)).sum().backward()
    got = [x.grad for x in leaves] + [ex[key].grad for key in sorted(ex)]
    names = ["dq", "dk", "dv"] + ["d" + key for key in sorted(ex)]
    assert_grads_close(got, want, GRAD_TOL[dtype], names)
    assert all(g.dtype == x.dtype for g, x in zip(got, leaves + [ex[key] for key in sorted(ex)]))


def test_reference_matches_numpy_reference():
    gen = torch.Generator().manual_seed(3)
    for scenario in ("gqa_sinks_bias_cap", "segments_window"):
        (q, k, v), extra, opts, _ = scenario_inputs(scenario, "f32", gen)
        out, lse = at.reference_attention(q, k, v, **extra, **opts)
        np_opts = {key: (x.numpy() if isinstance(x, torch.Tensor) else x) for key, x in {**extra, **opts}.items()}
        out_np, lse_np, _ = ref.attention(q.numpy(), k.numpy(), v.numpy(), **np_opts)
        np.testing.assert_allclose(out.numpy(), out_np, atol=1e-12, rtol=0)
        np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(lse_np))


def test_reference_gradcheck_float64():
    # The float64 reference the gradients are compared with is itself differentiated correctly,
    # with sinks, bias, soft cap, GQA, a window, a Mask and segment ids leaving row 0 fully
    # masked (tiny shapes: gradcheck builds the full Jacobian).
    gen = torch.Generator().manual_seed(5)

    def rand(*shape):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).requires_grad_()

    q, k, v, s, b = rand(1, 5, 2, 3), rand(1, 6, 1, 3), rand(1, 6, 1, 2), rand(2), rand(1, 2, 5, 6)
    seg_q = torch.tensor([[0, 1, 1, 2, 2]])
    seg_kv = torch.tensor([[1, 1, 1, 2, 2, 2]])
    opts = {"causal": False, "sliding_window": (3, 1), "logits_soft_cap": 1.5, "segment_ids_q": seg_q,
            "segment_ids_kv": seg_kv, "mask": M.per_head([M.causal(), M.full()])}

    def f(q, k, v, s, b):
        return at.reference_attention(q, k, v, sinks=s, bias=b, **opts)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, s, b))
    out = f(q, k, v, s, b)
    assert (out[0, 0] == 0).all()  # the fully masked row


@pytest.mark.parametrize("backend", ["native", "cpu"])
def test_gradcheck_attnops_function(backend):
    # gradcheck of attnops.torch.attention itself. The kernels compute in float32, so float64
    # gradcheck does not apply: float32 inputs, a step of 1e-2 and float32-level tolerances.
    gen = torch.Generator().manual_seed(11)
    q = torch.rand(1, 6, 2, 4, generator=gen) - 0.5
    k = torch.rand(1, 7, 1, 4, generator=gen) - 0.5
    v = torch.rand(1, 7, 1, 5, generator=gen) - 0.5
    s = torch.rand(2, generator=gen) - 0.5
    b = torch.rand(1, 2, 6, 7, generator=gen) - 0.5
    args = [x.requires_grad_() for x in (q, k, v, s, b)]
    op = operator("flash_attn2")

    def f(q, k, v, s, b):
        return at.attention(q, k, v, op=op, backend=backend, sinks=s, bias=b, logits_soft_cap=2.0)

    with pytest.warns(UserWarning):  # "... is not a double precision floating point ..."
        assert torch.autograd.gradcheck(f, args, eps=1e-2, atol=2e-3, rtol=2e-2)


def test_op_backward_on_numpy_arrays():
    rng = np.random.default_rng(1)
    q, k, v = ref.random_inputs(rng, 1, 12, 12, 4, 2, 8, 8, "f32")
    sinks = rng.uniform(-1, 1, 4).astype(np.float32)
    bias = rng.uniform(-1, 1, (1, 1, 12, 12)).astype(np.float32)
    op = operator("blocksparse")
    fwd = op(q, k, v, sinks=sinks, bias=bias, backend="cpu", return_lse=True)
    dout = rng.uniform(-1, 1, fwd.out.shape).astype(np.float32)
    g = op.backward(q, k, v, fwd.out, fwd.lse, dout, sinks=sinks, bias=bias, backend="cpu")
    dq, dk, dv, dsinks, dbias = g  # unpacks as a 5-tuple
    assert isinstance(dq, np.ndarray) and dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dsinks.shape == (4,) and dbias.shape == (1, 1, 12, 12)
    assert g.decision["pass"] == "backward" and g.decision["backend"] == "cpu"
    assert g.decision["operator"] == "blocksparse"
    t = [torch.from_numpy(x).double().requires_grad_() for x in (q, k, v, sinks, bias)]
    out, _ = at.reference_attention(t[0], t[1], t[2], sinks=t[3], bias=t[4])
    (out * torch.from_numpy(dout).double()).sum().backward()
    for got, leaf in zip(g, t):
        np.testing.assert_allclose(got, leaf.grad.numpy(), atol=4e-5 * max(1, leaf.grad.abs().max().item()), rtol=0)


def test_only_the_inputs_that_require_grad_get_one():
    q = torch.rand(1, 8, 2, 8, requires_grad=True)
    k = torch.rand(1, 8, 2, 8)
    v = torch.rand(1, 8, 2, 8, requires_grad=True)
    sinks = torch.zeros(2)  # no grad wanted
    at.attention(q, k, v, op="flash_attn2", sinks=sinks).sum().backward()
    assert q.grad is not None and v.grad is not None and k.grad is None and sinks.grad is None


def test_return_lse_and_runtime_dtype():
    q = torch.rand(1, 8, 2, 8, requires_grad=True)
    out, lse = at.attention(q, q, q, op="vanilla", return_lse=True, runtime_dtype="bf16")
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and not lse.requires_grad
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()
    with pytest.raises(TypeError, match="return_weights"):
        at.attention(q, q, q, return_weights=True)
