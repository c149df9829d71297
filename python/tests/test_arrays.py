"""Arrays in and out without copies: numpy through the buffer protocol (float32, float16, bf16 as
uint16 with dtype="bf16"), torch CPU tensors through DLPack (float32, float16, bfloat16;
requires_grad; non-contiguous views), other DLPack producers; outputs in the caller's kind;
decision["bytes_copied"]; the DLPack capsule's lifetime (consumed once, deleter run once)."""

import gc
import sys
import tracemalloc

import numpy as np
import pytest

import attnops
import reference as ref


@pytest.fixture(scope="module")
def op():
    return attnops.registry().get("vanilla", config={"backend": "cpu"})


def test_numpy_contiguous_input_is_not_copied(op):
    # The library copies nothing (decision["bytes_copied"] == 0) and the binding allocates no
    # numpy memory of the inputs' size (tracemalloc sees numpy's data allocations).
    rng = np.random.default_rng(0)
    q, k, v = ref.random_inputs(rng, 1, 256, 256, 4, 4, 64, 64, "f32")  # 256 KiB each
    op(q, k, v)  # warm up (first-call allocations)
    tracemalloc.start()
    res = op(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert res.decision["bytes_copied"] == 0
    assert peak < q.nbytes // 4, peak
    # The output is C++ memory owned by the array (no copy into numpy either).
    assert not res.out.flags["OWNDATA"] and res.out.base is not None


def test_outer_strided_view_is_passed_as_a_view(op):
    # k, v: the first T rows of a KV cache allocated for Tmax rows (a slice, outer strides only).
    rng = np.random.default_rng(1)
    q, kc, vc = ref.random_inputs(rng, 2, 8, 32, 2, 2, 16, 16, "f32")
    k, v = kc[:, :20], vc[:, :20]
    assert not k.flags["C_CONTIGUOUS"]
    res = op(q, k, v, return_lse=True)
    assert res.decision["bytes_copied"] == 0
    out_ref, _, _ = ref.attention(q, k, v)
    np.testing.assert_allclose(res.out, out_ref, atol=2e-5, rtol=0)


def test_innermost_strided_view_is_a_recorded_copy(op):
    rng = np.random.default_rng(2)
    q, k, v = ref.random_inputs(rng, 1, 8, 8, 2, 2, 32, 16, "f32")
    k2 = k[..., ::2]  # innermost stride 2: the library copies it, and says so
    q2 = np.ascontiguousarray(q[..., ::2])
    res = op(q2, k2, v)
    assert res.decision["bytes_copied"] == k2.size * 4
    np.testing.assert_allclose(res.out, ref.attention(q2, k2, v)[0], atol=2e-5, rtol=0)


def test_negative_strides_and_memoryview(op):
    rng = np.random.default_rng(3)
    q, k, v = ref.random_inputs(rng, 1, 8, 8, 2, 2, 8, 8, "f32")
    kr = k[:, ::-1]  # negative outer stride
    res = op(q, kr, v)
    assert res.decision["bytes_copied"] == 0
    np.testing.assert_allclose(res.out, ref.attention(q, kr, v)[0], atol=2e-5, rtol=0)
    res = op(memoryview(q), memoryview(k), memoryview(v))  # any buffer-protocol object
    assert isinstance(res.out, np.ndarray)
    np.testing.assert_allclose(res.out, ref.attention(q, k, v)[0], atol=2e-5, rtol=0)


def test_numpy_dtypes(op):
    rng = np.random.default_rng(4)
    for dtype, npt in (("f32", np.float32), ("f16", np.float16), ("bf16", np.uint16)):
        q, k, v = ref.random_inputs(rng, 1, 8, 8, 2, 2, 8, 8, dtype)
        res = op(q, k, v, dtype="bf16" if dtype == "bf16" else None, return_lse=True)
        assert res.out.dtype == npt and res.lse.dtype == np.float32
        assert res.decision["bytes_copied"] == 0
    with pytest.raises(attnops.UnsupportedDtype, match='dtype="bf16"'):
        op(q, k, v)  # uint16 without dtype="bf16"
    with pytest.raises(attnops.UnsupportedDtype, match="float64"):
        op(q.astype(np.float64), k, v)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_round_trip(op, dtype):
    gen = torch.Generator().manual_seed(5)
    q = (torch.rand(2, 9, 4, 8, generator=gen) - 0.5).to(dtype)
    k = (torch.rand(2, 9, 2, 8, generator=gen) - 0.5).to(dtype)
    v = (torch.rand(2, 9, 2, 12, generator=gen) - 0.5).to(dtype)
    res = op(q, k, v, return_lse=True, return_weights=True)
    assert isinstance(res.out, torch.Tensor) and res.out.dtype == dtype and res.out.shape == (2, 9, 4, 12)
    assert isinstance(res.lse, torch.Tensor) and res.lse.dtype == torch.float32
    assert isinstance(res.weights, torch.Tensor)
    assert res.decision["bytes_copied"] == 0
    out_ref, lse_ref, _ = ref.attention(q.double().numpy(), k.double().numpy(), v.double().numpy())
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    np.testing.assert_allclose(res.out.double().numpy(), out_ref, atol=tol, rtol=0)
    np.testing.assert_allclose(res.lse.numpy(), lse_ref, atol=1e-3, rtol=0)
    # The same call on numpy gives the same bits (bf16: uint16 patterns).
    if dtype != torch.bfloat16:
        res_np = op(q.numpy(), k.numpy(), v.numpy())
        assert np.array_equal(res_np.out, res.out.numpy())
    else:
        bits = lambda t: t.view(torch.int16).numpy().view(np.uint16)  # noqa: E731
        res_np = op(bits(q), bits(k), bits(v), dtype="bf16")
        assert np.array_equal(res_np.out, bits(res.out))


def test_torch_views_and_requires_grad(op):
    gen = torch.Generator().manual_seed(6)
    cache_k = torch.rand(1, 64, 2, 16, generator=gen)
    cache_v = torch.rand(1, 64, 2, 16, generator=gen)
    q = torch.rand(1, 4, 2, 16, generator=gen, requires_grad=True)  # detach()ed by the binding
    k, v = cache_k[:, :40], cache_v[:, :40]
    res = op(q, k, v)
    assert res.decision["bytes_copied"] == 0 and not res.out.requires_grad
    np.testing.assert_allclose(res.out.numpy(), ref.attention(q.detach().numpy(), k.numpy(), v.numpy())[0],
                               atol=2e-5, rtol=0)
    # A transposed view (innermost stride != 1) is copied by the library, recorded.
    kt = torch.rand(1, 2, 40, 16, generator=gen).transpose(1, 2).transpose(2, 3).contiguous().transpose(2, 3)
    assert kt.stride(-1) != 1
    res = op(q, kt, v)
    assert res.decision["bytes_copied"] == kt.numel() * 4
    np.testing.assert_allclose(res.out.numpy(), ref.attention(q.detach().numpy(), kt.numpy(), v.numpy())[0],
                               atol=2e-5, rtol=0)


class Producer:
    """A DLPack producer that is neither numpy nor torch, exporting a numpy array's memory."""

    def __init__(self, array, capsule=None):
        self.array, self.capsule, self.calls = array, capsule, 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.capsule if self.capsule is not None else self.array.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


def test_dlpack_capsule_is_consumed_and_its_deleter_runs(op):
    rng = np.random.default_rng(7)
    q, k, v = ref.random_inputs(rng, 1, 8, 8, 2, 2, 8, 8, "f32")
    before = sys.getrefcount(q)
    p = Producer(q)
    res = op(p, k, v)  # q through DLPack: numpy's capsule holds a reference to q until deleted
    assert p.calls == 1 and isinstance(res.out, np.ndarray)  # a non-torch producer: numpy out
    np.testing.assert_allclose(res.out, op(q, k, v).out, atol=0, rtol=0)
    del p
    gc.collect()
    assert sys.getrefcount(q) == before  # the deleter ran once (no leak; a second run would crash)


def test_used_capsule_is_refused(op):
    q = np.zeros((1, 4, 1, 4), np.float32)
    cap = q.__dlpack__()
    torch.utils.dlpack.from_dlpack(cap)  # consumes it (renamed "used_dltensor")
    with pytest.raises(TypeError, match="used_dltensor"):
        op(Producer(q, capsule=cap), q, q)


def test_outputs_outlive_the_result(op):
    q = torch.rand(1, 8, 2, 8)
    res = op(q, q, q, return_lse=True)
    out, lse = res.out, res.lse
    expected = out.clone()
    del res
    gc.collect()
    for _ in range(3):
        op(q, q, q)  # reuse freed memory if the output had been freed
    assert torch.equal(out, expected) and torch.isfinite(lse).all()
    arr = op(q.numpy(), q.numpy(), q.numpy()).out  # the Result is gone at once
    np.testing.assert_array_equal(arr, expected.numpy())


def forged_capsule(device_type, data):
    """A legacy "dltensor" capsule (DLPack 0.6 ABI, built with ctypes) over `data` (a float32
    numpy array kept alive by the caller), claiming to live on `device_type`; no deleter."""
    import ctypes

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]

    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

    class DLManagedTensor(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    shape = (ctypes.c_int64 * data.ndim)(*data.shape)
    m = DLManagedTensor()
    m.dl_tensor = DLTensor(data.ctypes.data, DLDevice(device_type, 0), data.ndim, DLDataType(2, 32, 1),
                           shape, None, 0)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    keep = (m, shape)  # the structures must outlive the capsule's use
    return new(ctypes.addressof(m), b"dltensor", None), keep


def test_dlpack_devices_and_dtypes_checked(op):
    q = np.random.default_rng(8).uniform(-1, 1, (1, 4, 1, 4)).astype(np.float32)
    cap, keep = forged_capsule(1, q)  # kDLCPU: accepted, strides None = compact
    res = op(Producer(q, capsule=cap), q, q)
    np.testing.assert_array_equal(res.out, op(q, q, q).out)
    cap, keep = forged_capsule(2, q)  # kDLCUDA: refused, naming the argument
    with pytest.raises(attnops.InvalidArgument, match="q: a DLPack tensor on device type 2"):
        op(Producer(q, capsule=cap), q, q)
    with pytest.raises(attnops.UnsupportedDtype, match="float64"):
        op(torch.zeros(1, 4, 1, 4, dtype=torch.float64), q, q)


def test_dtype_spellings(op):
    q = np.zeros((1, 4, 1, 8), np.float32)
    for spelling in ("f16", "float16", "half", np.float16, np.dtype("float16"), torch.float16):
        assert op(q, q, q, runtime_dtype=spelling).out.dtype == np.float16, spelling
    assert op(q, q, q, runtime_dtype=torch.bfloat16).out.dtype == np.uint16  # bf16 bits for numpy
    with pytest.raises(attnops.InvalidArgument, match="runtime_dtype: expected"):
        op(q, q, q, runtime_dtype="f64")
    with pytest.raises(TypeError, match="runtime_dtype: expected a dtype name"):
        op(q, q, q, runtime_dtype=object())
