"""Pure-torch stand-ins for nano-vllm's kernels: flash-attn's two attention functions and its Triton KV store.

Installed only where the real packages are absent (`install()`): the modules
`flash_attn` and `triton` get stand-ins in `sys.modules` while nano-vllm's
attention imports (its `@triton.jit` kernel is then a plain function nobody
calls; the Triton stand-in is removed again, as torch probes for a real one), and
`nanovllm.layers.attention.store_kvcache`, the one function that launches the
Triton kernel, is replaced. The shapes and conventions are nano-vllm's: a KV
cache of `[blocks, block_size, kv_heads, head_dim]` per layer, slot -1 skipped,
block tables padded with -1, decode queries `[batch, 1, heads, head_dim]`.
"""

from __future__ import annotations

import sys
import types

import torch


def store_kvcache(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Write each token's key and value at its slot; a slot of -1 (padding) writes nothing."""
    n = key.shape[0]
    valid = (slot_mapping >= 0)[:, None]
    slots = slot_mapping.clamp(min=0).long()
    for cache, new in ((k_cache, key), (v_cache, value)):
        flat = cache.view(-1, new[0].numel())
        kept = flat.index_select(0, slots)
        flat.index_copy_(0, slots, torch.where(valid, new.reshape(n, -1), kept))


def _attend(q, k, v, valid, scale):
    """q [t, h, d], k/v [t', kv, d], valid [t, t'] -> [t, h, d] (float32 math, rows with no key give 0)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1).float(), v.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    probs = torch.softmax(scores.masked_fill(~valid[None], float("-inf")), -1).nan_to_num(0.0)
    v = torch.where(valid.any(0)[:, None, None], v, 0.0)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal=True):
    """Decode: one query per sequence against its cached keys, gathered through its block table."""
    table = block_table.long().clamp(min=0)                 # -1 entries lie past the sequence: masked
    k, v = k_cache[table].flatten(1, 2), v_cache[table].flatten(1, 2)
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < cache_seqlens[:, None].long()
    out = [_attend(q[b], k[b], v[b], valid[b:b + 1], softmax_scale) for b in range(q.shape[0])]
    return torch.stack(out)


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k, softmax_scale,
                           causal=True, block_table=None):
    """Prefill: causal attention within each sequence of a packed batch (eager only: reads lengths on the host)."""
    assert block_table is None, "the stand-in has no prefix cache"
    out, qs, ks = torch.empty_like(q), cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for (q0, q1), (k0, k1) in zip(zip(qs, qs[1:]), zip(ks, ks[1:])):
        rows = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)
        valid = torch.arange(k1 - k0, device=q.device)[None, :] <= rows
        out[q0:q1] = _attend(q[q0:q1], k[k0:k1], v[k0:k1], valid, softmax_scale)
    return out


def _module(name: str, **names) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    return module


def install() -> list[str]:
    """Stand in for flash-attn and Triton where they are missing; returns what was stood in for."""
    done = []
    for name in ("flash_attn", "triton"):
        try:
            __import__(name)
        except ImportError:
            done.append(name)
    if "flash_attn" in done:
        sys.modules["flash_attn"] = _module("flash_attn", flash_attn_varlen_func=flash_attn_varlen_func,
                                            flash_attn_with_kvcache=flash_attn_with_kvcache)
    if "triton" in done:          # only while nano-vllm's attention imports it: torch probes for a real Triton
        language = _module("triton.language", constexpr=int)
        sys.modules["triton"] = _module("triton", jit=lambda fn: fn, language=language)
        sys.modules["triton.language"] = language
    try:
        from nanovllm.layers import attention
    finally:
        if "triton" in done:
            del sys.modules["triton"], sys.modules["triton.language"]
    if "triton" in done:
        attention.store_kvcache = store_kvcache
    return done
