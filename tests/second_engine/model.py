"""A small Llama forward, gpt-fast style: static KV cache tensors indexed by (cache row, position).

Every request owns one row of each layer's cache ([rows, max_seq, kv_heads,
head_dim]); a forward over tokens [B, S] at positions [B, S] writes its keys
and values at (rows[b], positions[b, s]) and attends over the whole row,
masked to positions <= its own. Padded rows of a batch point at a trash row,
so what they write is never read by a real request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tests.second_engine.weights import Config, Eagle, Layer, Target


@dataclass
class LayerCache:
    k: torch.Tensor     # [rows, max_seq, kv_heads, head_dim]
    v: torch.Tensor     # [rows, max_seq, kv_heads, head_dim]


def new_cache(config: Config, num_layers: int, rows: int, max_seq: int, device) -> list[LayerCache]:
    """Zeroed caches for `num_layers` layers, `rows` cache rows of `max_seq` positions."""
    shape = (rows, max_seq, config.kv_heads, config.head_dim)
    return [LayerCache(torch.zeros(shape, device=device), torch.zeros(shape, device=device))
            for _ in range(num_layers)]


def rope_tables(config: Config, max_seq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_seq, head_dim] of Llama's default RoPE (rotate-half layout)."""
    inv = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, device=device).float() / config.head_dim)
    freqs = torch.outer(torch.arange(max_seq, device=device).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention(x, layer: Layer, config: Config, cache: LayerCache, positions, rows, rope) -> torch.Tensor:
    """Self-attention of x [B, S, hidden] through the static cache rows `rows` [B]."""
    b, s, _ = x.shape
    q = (x @ layer.wq.T).view(b, s, config.heads, config.head_dim)
    k = (x @ layer.wk.T).view(b, s, config.kv_heads, config.head_dim)
    v = (x @ layer.wv.T).view(b, s, config.kv_heads, config.head_dim)
    cos, sin = rope[0][positions].unsqueeze(2), rope[1][positions].unsqueeze(2)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    cache.k[rows[:, None], positions] = k
    cache.v[rows[:, None], positions] = v
    group = config.heads // config.kv_heads
    keys = cache.k[rows].repeat_interleave(group, dim=2)        # [B, T, heads, head_dim]
    values = cache.v[rows].repeat_interleave(group, dim=2)
    scores = torch.einsum("bshd,bthd->bhst", q, keys) * config.head_dim ** -0.5
    visible = torch.arange(keys.shape[1], device=x.device) <= positions[:, None, :, None]   # [B, 1, S, T]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    out = torch.einsum("bhst,bthd->bshd", probs, values).reshape(b, s, config.heads * config.head_dim)
    return out @ layer.wo.T


def mlp(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    """SwiGLU."""
    return (F.silu(x @ layer.w_gate.T) * (x @ layer.w_up.T)) @ layer.w_down.T


def target_forward(t: Target, caches, tokens, positions, rows, rope) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, S, vocab], final-normed hidden [B, S, hidden]) for tokens [B, S]."""
    c = t.config
    x = t.embed[tokens]
    for layer, cache in zip(t.layers, caches):
        x = x + attention(rms_norm(x, layer.attn_norm, c.eps), layer, c, cache, positions, rows, rope)
        x = x + mlp(rms_norm(x, layer.mlp_norm, c.eps), layer)
    hidden = rms_norm(x, t.norm, c.eps)
    return hidden @ t.lm_head.T, hidden


def draft_forward(t: Target, e: Eagle, caches, tokens, hidden, positions, rows, rope) -> torch.Tensor:
    """EAGLE-1: draft hidden states [B, S, hidden] from tokens [B, S] and target hidden [B, S, hidden]."""
    c = t.config
    x = torch.cat((t.embed[tokens], hidden), dim=-1) @ e.fc.T
    x = x + attention(x, e.layer, c, caches[0], positions, rows, rope)
    return x + mlp(rms_norm(x, e.layer.mlp_norm, c.eps), e.layer)
