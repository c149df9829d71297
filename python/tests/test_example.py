"""The README's example: a two-layer transformer trained with attnops.torch.attention follows the
loss curve of the same model with a PyTorch math attention (python/examples/train_transformer.py)."""

import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import train_transformer  # noqa: E402


def test_loss_curves_match():
    ours, theirs = train_transformer.run(steps=10, op="flash_attn2")
    assert ours[-1] < ours[0]  # it learns
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-4 * abs(b), (ours, theirs)
