"""A two-layer transformer in PyTorch, trained for a few steps on the CPU on random data, twice
from the same weights: once with attnops.torch.attention as its attention, once with a PyTorch
math attention (softmax(q k^T / sqrt(d) + causal mask) v). Prints both loss curves side by side.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/train_transformer.py --steps 40

The task (copy the token 3 positions back) needs attention, so the loss falls."""

import argparse
import copy
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import attnops.torch


def math_attention(q, k, v):
    """PyTorch math attention, causal, over BTHD tensors (torch 1.13 has no SDPA)."""
    t = q.shape[1]
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(dim=-1), v)


class Block(nn.Module):
    def __init__(self, dim, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, dim // self.heads).unbind(2)  # BTHD views
        x = x + self.proj(self.attention(q, k, v).reshape(b, t, dim))
        return x + self.mlp(self.norm2(x))


class TwoLayerTransformer(nn.Module):
    def __init__(self, vocab, dim, heads, seq, attention):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, attention) for _ in range(2)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def train(model, data, steps, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run(steps=40, op="flash_attn2", batch=8, seq=64, dim=64, heads=4, vocab=32, lr=1e-2, seed=0):
    """(attnops losses, math losses)."""
    torch.manual_seed(seed)
    data = []
    for _ in range(8):
        x = torch.randint(0, vocab, (batch, seq))
        y = torch.roll(x, 3, dims=1)  # the token 3 positions back
        y[:, :3] = 0
        data.append((x, y))
    operator = attnops.registry().get(op)

    def attnops_attention(q, k, v):
        return attnops.torch.attention(q, k, v, op=operator, causal=True)

    base = TwoLayerTransformer(vocab, dim, heads, seq, attention=None)
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    for blk in ours.blocks:
        blk.attention = attnops_attention
    for blk in theirs.blocks:
        blk.attention = math_attention
    return train(ours, data, steps, lr), train(theirs, data, steps, lr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--op", default="flash_attn2", help="attnops operator (vanilla, blocksparse, flash_attn2)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    ours, theirs = run(steps=a.steps, op=a.op, seed=a.seed)
    print(f"{'step':>4}  {'attnops (' + a.op + ')':>22}  {'PyTorch math':>14}  {'rel. diff':>9}")
    for i, (x, y) in enumerate(zip(ours, theirs)):
        print(f"{i:>4}  {x:>22.6f}  {y:>14.6f}  {abs(x - y) / abs(y):>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
