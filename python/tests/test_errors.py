"""Errors: every attnops::ErrorCode has its exception class (deriving from attnops.Error and the
fitting builtin), raised with the C++ message; bad Python arguments are TypeErrors."""

import os

import numpy as np
import pytest

import attnops
from attnops import _attnops


def test_one_class_per_error_code():
    codes = _attnops.error_codes()
    assert len(codes) == 12
    by_code = {cls.code: cls for cls in attnops.Error.__subclasses__()}
    assert sorted(by_code) == sorted(codes)
    for cls in by_code.values():
        assert issubclass(cls, attnops.Error) and getattr(attnops, cls.__name__) is cls
    assert issubclass(attnops.ShapeMismatch, ValueError)
    assert issubclass(attnops.InvalidArgument, ValueError)
    assert issubclass(attnops.ConfigError, ValueError)
    assert issubclass(attnops.UnsupportedDtype, TypeError)
    assert issubclass(attnops.UnknownOperator, KeyError)
    assert issubclass(attnops.IoError, OSError)
    assert issubclass(attnops.OutOfMemory, MemoryError)
    assert issubclass(attnops.OperatorNotImplemented, NotImplementedError)
    assert issubclass(attnops.BackendUnavailable, RuntimeError)


q = np.zeros((2, 16, 4, 8), np.float32)
op = attnops.registry().get("flash_attn2")


@pytest.mark.parametrize(
    "call, cls, code, message",
    [
        (lambda: op(q, q[:, :, :3], q[:, :, :3]), attnops.ShapeMismatch, "shape_mismatch", "k: Hq % Hkv must be 0"),
        (lambda: op(q, np.zeros((2, 16, 4, 9), np.float32), q), attnops.ShapeMismatch, "shape_mismatch",
         r"k: expected shape \[B=2, Tk, Hkv, D=8\]"),
        (lambda: op(q[0], q, q), attnops.ShapeMismatch, "shape_mismatch", "q: expected rank 4"),
        (lambda: op(q, q.astype(np.float16), q), attnops.UnsupportedDtype, "unsupported_dtype",
         "k: dtype f16 differs from q's f32"),
        (lambda: op(q, q, q, sliding_window=(-1, 0)), attnops.InvalidArgument, "invalid_argument", "sliding_window"),
        (lambda: op(q, q, q, logits_soft_cap=0.0), attnops.InvalidArgument, "invalid_argument", "logits_soft_cap"),
        (lambda: op(q, q, q, sinks=np.zeros(3, np.float32)), attnops.ShapeMismatch, "shape_mismatch",
         r"^sinks \(softmax_aux\): expected shape \[Hq=4\]"),
        (lambda: op(q, q, q, return_weights=True), attnops.InvalidArgument, "invalid_argument", "return_weights"),
        (lambda: attnops.registry().get("flash", config={"disabled_backends": ["gpu", "cpu", "native"]})(q, q, q),
         attnops.BackendUnavailable, "backend_unavailable", "no backend can run 'flash_attn2'"),
        (lambda: op(q, q, q, backend="cpu", num_threads=-1), attnops.InvalidArgument, "invalid_argument",
         "num_threads"),
        (lambda: attnops.registry().get("flsh"), attnops.UnknownOperator, "unknown_operator",
         "did you mean 'flash'"),
        (lambda: attnops.registry().get("flash", config={"backnd": "cpu"}), attnops.ConfigError, "config_error",
         "<dict>.*backnd.*did you mean 'backend'"),
        (lambda: attnops.registry().get("flash", config={"operators": {"nope": {}}}), attnops.ConfigError,
         "config_error", "unknown operator 'nope'"),
        (lambda: attnops.registry().get("flash", config="/nonexistent/attnops.yaml"), attnops.IoError, "io_error",
         "/nonexistent/attnops.yaml"),
        (lambda: attnops.Mask.local(-1, 0), attnops.InvalidArgument, "invalid_argument", "local"),
    ],
)
def test_errors_carry_code_and_message(call, cls, code, message):
    with pytest.raises(cls, match=message) as info:
        call()
    assert info.value.code == code
    assert isinstance(info.value, attnops.Error)


def test_unavailable_backend_is_a_reason_not_an_error():
    d = op(q, q, q, backend="tpu").decision  # tpu first, then the auto order
    assert d["backend"] in ("cpu", "gpu") and d["reasons"][0]["code"] == "backend_unavailable"


def test_unknown_operator_message_is_plain():
    with pytest.raises(KeyError) as info:
        attnops.registry().get("nope")
    assert str(info.value).startswith("unknown operator 'nope'; registered: blocksparse (alias splash)")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"causal": 1}, "causal: expected True or False, got int"),
        ({"sliding_window": "big"}, "sliding_window: expected"),
        ({"chunk_size": 2.5}, "chunk_size: expected an integer"),
        ({"mask": "causal"}, "mask: expected an attnops.Mask"),
        ({"casual": True}, "unexpected keyword argument 'casual'; did you mean 'causal'"),
        ({"window": (1, 1)}, "did you mean 'sliding_window'"),
        ({"backend": 3}, "backend: expected"),
    ],
)
def test_bad_python_arguments_are_type_errors(kwargs, message):
    with pytest.raises(TypeError, match=message):
        op(q, q, q, **kwargs)


def test_non_arrays_are_type_errors():
    with pytest.raises(TypeError, match="q: expected a numpy array, a tensor with __dlpack__"):
        op([[1.0]], q, q)
    with pytest.raises(TypeError, match="config: expected a YAML file path"):
        attnops.registry().get("vanilla", config=3)


def test_no_output_on_error_and_state_intact():
    # A failed call leaves nothing behind: the next call works.
    with pytest.raises(attnops.ShapeMismatch):
        op(q, q[:, :, :3], q)
    assert op(q, q, q).out.shape == q.shape
    assert not os.environ.get("ATTNOPS_FORCE_NATIVE")


def test_environment_is_read_once_until_reloaded(monkeypatch):
    # The library reads ATTNOPS_FORCE_NATIVE once per process: a change to os.environ
    # after the first call takes effect at attnops.reload_environment(), not before.
    q = np.random.default_rng(0).standard_normal((1, 128, 2, 16)).astype(np.float32)
    cpu_op = attnops.registry().get("flash_attn2", config={"backend": ["cpu"], "disabled_backends": ["gpu"]})
    assert cpu_op(q, q, q).decision["backend"] == "cpu"
    monkeypatch.setenv("ATTNOPS_FORCE_NATIVE", "1")
    try:
        assert cpu_op(q, q, q).decision["backend"] == "cpu"  # not read again
        attnops.reload_environment()
        assert cpu_op(q, q, q).decision["backend"] == "native"
    finally:
        monkeypatch.delenv("ATTNOPS_FORCE_NATIVE")
        attnops.reload_environment()
    assert cpu_op(q, q, q).decision["backend"] == "cpu"
