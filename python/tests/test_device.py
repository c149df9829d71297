"""attnops.DeviceTensor on the Vulkan backend (lavapipe here: software devices allowed), a KV
cache kept on the device and appended to through slices, outputs left on the device,
release_gpu(). Skipped without a Vulkan device."""

import numpy as np
import pytest

import attnops
import reference as ref
from conftest import gpu_available

pytestmark = pytest.mark.skipif(not gpu_available(), reason="no Vulkan device (mesa-vulkan-drivers)")

GPU = {"gpu": {"allow_software": True}}


def test_kv_cache_on_the_device():
    rng = np.random.default_rng(0)
    b, tmax, hkv, d, t = 2, 64, 2, 32, 40
    q, k, v = ref.random_inputs(rng, b, 1, tmax, 4, hkv, d, d, "f16")
    ck = attnops.DeviceTensor.zeros([b, tmax, hkv, d], "f16", allow_software=True)
    cv = attnops.DeviceTensor.zeros([b, tmax, hkv, d], "f16", allow_software=True)
    assert ck.shape == (b, tmax, hkv, d) and ck.dtype == "f16" and ck.__dlpack_device__() == (7, 0)
    ck.slice(1, 0, t).copy_from(k[:, :t])  # prefill rows [0, t)
    cv.slice(1, 0, t).copy_from(v[:, :t])
    ck.slice(1, t, t + 1).copy_from(k[:, t:t + 1])  # append one row
    cv.slice(1, t, t + 1).copy_from(v[:, t:t + 1])
    view = ck.slice(1, 0, t + 1)
    assert view.shape == (b, t + 1, hkv, d) and not view.is_contiguous and view.strides[0] == tmax * hkv * d
    np.testing.assert_array_equal(view.numpy(), k[:, :t + 1])

    op = attnops.registry().get("flash_attn2", config=GPU)
    res = op(q, view, cv.slice(1, 0, t + 1), return_lse=True)
    d_ = res.decision
    assert d_["backend"] == "gpu" and d_["inputs"] == "mixed" and d_["output"] == "host"
    assert isinstance(res.out, np.ndarray) and res.out.dtype == np.float16
    out_ref, lse_ref, _ = ref.attention(q.astype(np.float64), k[:, :t + 1].astype(np.float64),
                                        v[:, :t + 1].astype(np.float64))
    np.testing.assert_allclose(res.out.astype(np.float64), out_ref, atol=2e-3, rtol=0)
    np.testing.assert_allclose(res.lse, lse_ref, atol=1e-3, rtol=0)


def test_output_stays_on_the_device_when_q_is_there():
    rng = np.random.default_rng(1)
    q, k, v = ref.random_inputs(rng, 1, 16, 16, 2, 2, 16, 16, "f32")
    dq = attnops.to_device(q, allow_software=True)
    res = attnops.registry().get("vanilla", config=GPU)(dq, k, v, return_lse=True)
    assert isinstance(res.out, attnops.DeviceTensor) and res.decision["output"] == "device"
    assert isinstance(res.lse, np.ndarray)
    np.testing.assert_allclose(res.out.numpy(), ref.attention(q, k, v)[0], atol=2e-5, rtol=0)
    torch = pytest.importorskip("torch")
    assert torch.equal(res.out.torch(), torch.from_numpy(res.out.numpy()))
    with pytest.raises(BufferError, match="Vulkan device memory"):
        res.out.__dlpack__()


def test_device_inputs_with_a_host_backend_are_refused():
    q = np.zeros((1, 8, 1, 8), np.float32)
    dk = attnops.to_device(q, allow_software=True)
    with pytest.raises(attnops.InvalidArgument, match="device tensor"):
        attnops.registry().get("vanilla", config=GPU)(q, dk, q, backend="cpu")
    with pytest.raises(attnops.ShapeMismatch):
        dk.copy_from(np.zeros((1, 4, 1, 8), np.float32))


def test_release_gpu_then_use_again():
    q = np.random.default_rng(2).uniform(-1, 1, (1, 8, 1, 8)).astype(np.float32)
    op = attnops.registry().get("vanilla", config=GPU)
    dt = attnops.to_device(q, allow_software=True)
    before = op(q, q, q, backend="gpu").out
    attnops.release_gpu()
    with pytest.raises(attnops.GpuError):
        dt.numpy()  # device memory of the released state: only destroyed
    del dt
    np.testing.assert_array_equal(op(q, q, q, backend="gpu").out, before)  # the state starts again
    attnops.release_gpu()
    attnops.release_gpu()  # more than once is fine
