"""A tiny decoder, gpt-fast style: the KV cache lives in the model as static buffers, one row per request.

`Decoder(tokens, positions, rows)` runs one decode token per row: it writes
its keys and values at (rows[b], positions[b]) and attends over the row up to
its position. Padded rows of a batch point at the trash row (the last one),
so what they write no real request reads. Weights are tiny and random.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, HIDDEN, HEADS, MAX_SEQ = 64, 32, 2, 32
PAD_ID = 0      # never generated: the pad token of padded rows


class KVCache(nn.Module):
    def __init__(self, rows: int, device):
        super().__init__()
        shape = (rows, MAX_SEQ, HEADS, HIDDEN // HEADS)
        self.register_buffer("k", torch.zeros(shape, device=device))
        self.register_buffer("v", torch.zeros(shape, device=device))

    def update(self, rows, positions, k, v):
        """Write this step's keys and values; return every row's cache [B, T, heads, head_dim]."""
        self.k[rows, positions] = k
        self.v[rows, positions] = v
        return self.k[rows], self.v[rows]


class Block(nn.Module):
    def __init__(self, rows: int, gen: torch.Generator, device):
        super().__init__()
        w = lambda *shape: nn.Parameter((torch.randn(shape, generator=gen) * 0.3).to(device), False)  # noqa: E731
        self.wqkv, self.wo, self.w1, self.w2 = w(3 * HIDDEN, HIDDEN), w(HIDDEN, HIDDEN), w(64, HIDDEN), w(HIDDEN, 64)
        self.cache = KVCache(rows, device)

    def forward(self, x, positions, rows):
        b, d = x.shape[0], HIDDEN // HEADS
        q, k, v = (x @ self.wqkv.T).view(b, 3, HEADS, d).unbind(1)
        q, k = q + positions[:, None, None] * 0.01, k + positions[:, None, None] * 0.01   # a toy position code
        keys, values = self.cache.update(rows, positions, k, v)
        scores = torch.einsum("bhd,bthd->bht", q, keys) * d ** -0.5
        visible = torch.arange(MAX_SEQ, device=x.device) <= positions[:, None, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        x = x + torch.einsum("bht,bthd->bhd", probs, values).reshape(b, HIDDEN) @ self.wo.T
        return x + torch.relu(x @ self.w1.T) @ self.w2.T


class Decoder(nn.Module):
    def __init__(self, layers: int, rows: int, seed: int, device="cpu"):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen).to(device), False)
        self.layers = nn.ModuleList(Block(rows, gen, device) for _ in range(layers))

    def forward(self, tokens, positions, rows):
        """Logits [B, vocab] of the next token after `tokens` [B] at `positions` [B] in cache `rows` [B]."""
        x = self.embed[tokens]
        for layer in self.layers:
            x = layer(x, positions, rows)
        logits = x @ self.embed.T
        return logits.masked_fill(torch.arange(VOCAB, device=x.device) == PAD_ID, float("-inf"))
