"""attnops: attention operators with backend dispatch, from Python.

The same library as the C++ API (include/attnops/), through a thin extension module:

    import numpy as np, attnops
    op = attnops.registry().get("blocksparse")            # or an alias: "splash"
    q = np.random.randn(1, 256, 8, 64).astype(np.float32)  # BTHD: [B, Tq, Hq, D]
    res = op(q, q, q, causal=True, return_lse=True)        # numpy in, numpy out, no copies
    res.out, res.lse, res.decision                         # decision: which kernel ran, and why
    out = attnops.attention(q, q, q, softmax_scale=0.1)    # flash-attn style: the output only

PyTorch (imported only when used): attnops.torch.attention(q, k, v, op="flash_attn2", ...)
is differentiable in q, k, v, sinks and bias. See python/README.md and the README's Python
section.
"""

import atexit as _atexit
import functools as _functools
from typing import Any as _Any
from typing import Optional as _Optional
from typing import Sequence as _Sequence
from typing import Tuple as _Tuple
from typing import Union as _Union

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
from ._operator import Operator  # noqa: E402,F401
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


@_functools.lru_cache(maxsize=64)
def _operator_by_name(name):
    return registry().get(name)


def attention(
    q: _Any,
    k: _Any,
    v: _Any,
    *,
    op: _Union[str, Operator] = "flash_attn2",
    causal: bool = True,
    softmax_scale: _Optional[float] = None,
    sliding_window: _Optional[_Union[int, _Tuple[int, int]]] = None,
    chunk_size: _Optional[int] = None,
    logits_soft_cap: _Optional[float] = None,
    sinks: _Any = None,
    bias: _Any = None,
    segment_ids_q: _Any = None,
    segment_ids_kv: _Any = None,
    mask: _Optional[Mask] = None,
    return_lse: bool = False,
    backend: _Optional[_Union[str, _Sequence[str]]] = None,
    runtime_dtype: _Any = None,
    num_threads: _Optional[int] = None,
    dtype: _Any = None,
    config: _Any = None,
) -> _Any:
    """Attention in the style of flash-attn's flash_attn_func: out [B, Tq, Hq, Dv] in q's kind
    (numpy array, torch tensor, attnops.DeviceTensor), or (out, lse) with return_lse=True (lse
    [B, Hq, Tq] float32). q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv].

    op: a registry name or alias, or an attnops.Operator; config: a YAML path, dict or Config
    for an op given by name (then an operator is built per call: keep one with
    attnops.registry().get(op, config) instead). The keywords are those of Operator.__call__;
    softmax_scale=None is 1/sqrt(D). For the decision or attention weights, call the operator
    (it returns an attnops.Result). Not differentiable: attnops.torch.attention is.
    """
    if isinstance(op, Operator):
        if config is not None:
            raise TypeError("attention: config= applies to an operator given by name")
    elif config is None:
        op = _operator_by_name(op)
    else:
        op = registry().get(op, config=config)
    res = op(q, k, v, causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
             chunk_size=chunk_size, logits_soft_cap=logits_soft_cap, sinks=sinks, bias=bias,
             segment_ids_q=segment_ids_q, segment_ids_kv=segment_ids_kv, mask=mask, return_lse=return_lse,
             backend=backend, runtime_dtype=runtime_dtype, num_threads=num_threads, dtype=dtype)
    return (res.out, res.lse) if return_lse else res.out


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
