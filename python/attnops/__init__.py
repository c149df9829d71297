"""attnops: attention operators with backend dispatch, from Python.

The same library as the C++ API (include/attnops/), through a thin extension module:

    import numpy as np, attnops
    op = attnops.registry().get("blocksparse")            # or an alias: "splash"
    q = np.random.randn(1, 256, 8, 64).astype(np.float32)  # BTHD: [B, Tq, Hq, D]
    res = op(q, q, q, causal=True, return_lse=True)        # numpy in, numpy out, no copies
    res.out, res.lse, res.decision                         # decision: which kernel ran, and why

PyTorch (imported only when used): attnops.torch.attention(q, k, v, op="flash_attn2", ...)
is differentiable in q, k, v, sinks and bias. See python/README.md and the README's Python
section.
"""

import atexit as _atexit

from . import _attnops
from ._errors import (  # noqa: F401  (re-exported)
    BackendUnavailable,
    ConfigError,
    Error,
    GpuError,
    InternalError,
    InvalidArgument,
    IoError,
    OperatorNotImplemented,
    OutOfMemory,
    ShapeMismatch,
    UnknownOperator,
    UnsupportedDtype,
    UnsupportedFeature,
)
from ._errors import ERROR_TYPES as _ERROR_TYPES

_attnops._set_error_types(_ERROR_TYPES)

from ._attnops import (  # noqa: E402,F401
    Config,
    DeviceTensor,
    Gradients,
    Mask,
    Operator,
    PagedKVCache,
    PagedPlan,
    RaggedBatch,
    Result,
    load_config,
    merge_states,
    parse_config,
    plan_paged,
    release_gpu,
    reload_environment,
)
from ._registry import Registry, registry  # noqa: E402,F401

__version__ = _attnops.__version__

__all__ = [
    "registry",
    "Registry",
    "Operator",
    "Result",
    "Gradients",
    "Mask",
    "DeviceTensor",
    "PagedKVCache",
    "RaggedBatch",
    "PagedPlan",
    "plan_paged",
    "merge_states",
    "to_device",
    "release_gpu",
    "reload_environment",
    "attention",
    "info",
    "load_config",
    "parse_config",
    "Config",
    "Error",
] + sorted(cls.__name__ for cls in _ERROR_TYPES.values())


def attention(q, k, v, op="blocksparse", *, config=None, **options):
    """One call of the operator `op` (a registry name or an attnops.Operator): a Result.
    Keywords: those of Operator.__call__ (causal, sliding_window, ..., backend, dtype)."""
    if not isinstance(op, Operator):
        op = registry().get(op, config=config)
    elif config is not None:
        raise TypeError("attention: config= applies to an operator given by name")
    return op(q, k, v, **options)


def to_device(array, **kwargs):
    """DeviceTensor.from_host(array, dtype=None, device="", allow_software=False)."""
    return DeviceTensor.from_host(array, **kwargs)


def info(config=None, allow_software=False):
    """What `attnops info --json` prints, as data: {"cpu", "gpu_devices", "operators"}."""
    from .info import collect

    return collect(config=config, allow_software=allow_software)


def __getattr__(name):
    # attnops.torch is imported on first use only (the core never imports torch).
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'attnops' has no attribute " + repr(name))


# The C++ contract: the GPU state is released before the program ends, never by a static
# destructor. release_gpu() waits for calls still running on other threads.
_atexit.register(release_gpu)
