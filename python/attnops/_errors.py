"""Exceptions: one class per attnops::ErrorCode, each deriving from attnops.Error and from the
builtin exception that fits (ValueError for bad input, ...). The message is the C++ one, which
names the argument, what was found and what was expected. ``code`` is the stable code string.

    try:
        op(q, k, v)
    except attnops.ShapeMismatch as e:     # also a ValueError, and an attnops.Error
        print(e.code, e)                    # shape_mismatch k: expected shape [B=2, Tk, Hkv, D=64] ...
"""


class Error(Exception):
    """Every error attnops raises (attnops::Error in C++). ``code`` names the kind."""

    code = "internal"


class InvalidArgument(Error, ValueError):
    """A value out of range (a scale that is not finite, a negative window, ...)."""

    code = "invalid_argument"


class ShapeMismatch(Error, ValueError):
    """Ranks or dimensions that disagree with each other or with the BTHD layout."""

    code = "shape_mismatch"


class UnsupportedDtype(Error, TypeError):
    """A dtype an argument cannot take (attnops stores float32, float16 and bf16)."""

    code = "unsupported_dtype"


class UnknownOperator(Error, KeyError):
    """A registry lookup of a name that is not registered (the message lists the names)."""

    code = "unknown_operator"

    def __str__(self):  # KeyError would print the message's repr
        return str(self.args[0]) if self.args else ""


class ConfigError(Error, ValueError):
    """YAML configuration: malformed, an unknown key, a wrong type or value (FILE:LINE:COL: ...)."""

    code = "config_error"


class IoError(Error, OSError):
    """A file (YAML, pipeline cache) that cannot be read or written."""

    code = "io_error"


class BackendUnavailable(Error, RuntimeError):
    """The backend is absent on this host (no Vulkan device, no TPU runtime), or none can run the call."""

    code = "backend_unavailable"


class OperatorNotImplemented(Error, NotImplementedError):
    """The operator has no forward (or backward) for this backend."""

    code = "not_implemented"


class UnsupportedFeature(Error, ValueError):
    """The backend cannot run these inputs (too large, head_dim, ...)."""

    code = "unsupported_feature"


class GpuError(Error, RuntimeError):
    """A runtime GPU failure (out of device memory, device lost, timeout)."""

    code = "gpu_error"


class OutOfMemory(Error, MemoryError):
    """Host memory for a tensor or a kernel's working set could not be allocated."""

    code = "out_of_memory"


class InternalError(Error, RuntimeError):
    """A bug in attnops."""

    code = "internal"


ERROR_TYPES = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        ShapeMismatch,
        UnsupportedDtype,
        UnknownOperator,
        ConfigError,
        IoError,
        BackendUnavailable,
        OperatorNotImplemented,
        UnsupportedFeature,
        GpuError,
        OutOfMemory,
        InternalError,
    )
}
