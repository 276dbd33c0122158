"""Paged attention, registered with transformers' attention interface.

Every LlamaAttention (target layers and the EAGLE head's decoder layer) calls
`paged_attention` with q/k/v after RoPE. It writes k/v into the paged cache at
`slot_mapping` and attends over the context gathered through `block_table`.

It reads only the metadata of `parity.engine.metadata.AttentionMetadata` and
has static shapes: the context is gathered over `max_model_len` positions and
masked, the request of each token is found with `bucketize` on
`query_start_loc`. No host sync, no Python branch on tensor values, so FULL and
PIECEWISE graphs capture it unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "parity_paged"

# Set by a piecewise graph capture: called at every attention instead of attending,
# so the capture can end its piece there (see parity/graphs/capture.py).
_SPLIT_HOOK: contextvars.ContextVar = contextvars.ContextVar("parity_attention_split", default=None)


@contextlib.contextmanager
def split_at_attention(hook):
    """Within this block every paged attention call is handed to `hook(module, q, k, v, scaling, meta)`."""
    token = _SPLIT_HOOK.set(hook)
    try:
        yield
    finally:
        _SPLIT_HOOK.reset(token)


def write_kv(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """Scatter `values` [T, KVH, D] into `cache` [num_slots + 1, KVH, D].

    PAD slots (-1) land in the trash row at the end of the cache, so padded
    tokens never touch a real slot.
    """
    trash = cache.shape[0] - 1
    slots = torch.where(slot_mapping < 0, torch.full_like(slot_mapping, trash), slot_mapping)
    cache.index_copy_(0, slots, values)


def context_slots(meta, token_req: torch.Tensor) -> torch.Tensor:
    """Slot of every context position j of every token's request: [T, L]."""
    block_size = meta.block_size
    j = torch.arange(meta.max_model_len, device=token_req.device)
    blocks = meta.block_table[token_req][:, j // block_size]  # [T, L]
    return blocks * block_size + (j % block_size)


def token_requests(meta, num_tokens: int) -> torch.Tensor:
    """Request row of each token, from query_start_loc; padded tokens clamp to the last row."""
    num_rows = meta.seq_lens.shape[0]
    t = torch.arange(num_tokens, device=meta.query_start_loc.device)
    rows = torch.bucketize(t, meta.query_start_loc[1:], right=True)
    return rows.clamp_(max=num_rows - 1)


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface entry: q [1, H, T, D], k/v [1, KVH, T, D] -> [1, T, H, D]."""
    meta = kwargs["paged"]
    split = _SPLIT_HOOK.get()
    if split is not None:
        # A piecewise capture ends its piece here and runs attention eagerly.
        return split(module, query, key, value, scaling, meta), None
    return attention_core(module, query, key, value, scaling, meta), None


def attention_core(module, query, key, value, scaling, meta) -> torch.Tensor:
    """Write k/v to the paged cache, attend over each token's context; returns [1, T, H, D]."""
    kv = meta.kv_cache
    layer = module.layer_idx
    # [1, H, T, D] -> [T, H, D]
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    num_tokens = q.shape[0]
    write_kv(kv.keys[layer], meta.slot_mapping, k)
    write_kv(kv.values[layer], meta.slot_mapping, v)

    token_req = token_requests(meta, num_tokens)
    slots = context_slots(meta, token_req)  # [T, L]
    k_ctx = kv.keys[layer][slots]  # [T, L, KVH, D]
    v_ctx = kv.values[layer][slots]
    groups = q.shape[1] // k_ctx.shape[2]
    if groups > 1:
        # GQA: each kv head serves `groups` query heads (expand+reshape: no host sync).
        t, length, kvh, d = k_ctx.shape
        k_ctx = k_ctx.unsqueeze(3).expand(t, length, kvh, groups, d).reshape(t, length, kvh * groups, d)
        v_ctx = v_ctx.unsqueeze(3).expand(t, length, kvh, groups, d).reshape(t, length, kvh * groups, d)

    j = torch.arange(meta.max_model_len, device=q.device)
    pos = meta.positions.unsqueeze(1)  # [T, 1]
    valid = (j.unsqueeze(0) <= pos) & (j.unsqueeze(0) < meta.seq_lens[token_req].unsqueeze(1))
    window = meta.window_for_layer(layer)
    if window is not None:
        valid &= j.unsqueeze(0) >= meta.window_starts().unsqueeze(1)

    scores = torch.einsum("thd,tlhd->thl", q.float(), k_ctx.float()) * scaling
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    # NOTE: padded tokens have no valid key; softmax over all -inf is NaN, so
    # their rows are zeroed to keep padding inert.
    has_key = valid.any(dim=1).view(num_tokens, 1, 1)
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(has_key, probs, torch.zeros_like(probs))
    out = torch.einsum("thl,tlhd->thd", probs, v_ctx.float()).to(query.dtype)
    return out.unsqueeze(0)


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
