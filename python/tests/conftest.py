"""Shared fixtures: which backends this host has, and the configuration that makes each operator
run its own kernels on small shapes (fallbacks off, 16 x 16 blocks, lavapipe allowed)."""

import pytest

import attnops
from attnops import _attnops

BACKENDS = ("native", "cpu", "gpu")
OPERATORS = ("vanilla", "blocksparse", "flash_attn2")
DTYPES = ("f32", "f16", "bf16")


def gpu_available():
    """A Vulkan device qualifies (lavapipe counts: software devices are allowed in the tests)."""
    if not hasattr(gpu_available, "cached"):
        gpu_available.cached = _attnops.host_availability("gpu", "", True, "")[0]
    return gpu_available.cached


def skip_without(backend):
    if backend == "gpu" and not gpu_available():
        pytest.skip("no Vulkan device (lavapipe: mesa-vulkan-drivers)")


def config_for(op):
    """A config dict: the operator's fallbacks off (its own kernel runs at any Tq, causal or not),
    16 x 16 blocks (several blocks on small shapes), software GPUs allowed."""
    cfg = {"gpu": {"allow_software": True}, "blocksize_q": 16, "blocksize_k": 16}
    if op != "vanilla":
        cfg["operators"] = {op: {"fallbacks": {"decode": False, "non_causal": False, "seq_multiple": False}}}
    return cfg


_OPS = {}


def operator(op):
    """attnops.registry().get(op, config=config_for(op)), cached per operator."""
    if op not in _OPS:
        _OPS[op] = attnops.registry().get(op, config=config_for(op))
    return _OPS[op]
