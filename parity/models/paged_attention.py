"""Paged attention, registered with transformers' attention interface.

Every LlamaAttention (target layers and the EAGLE head's decoder layer) calls
`paged_attention` with q/k/v after RoPE. It writes k/v into the paged cache at
`slot_mapping` and attends over each token's context through `block_table`.

Memory and shapes. The context is never gathered whole: it is walked in static
chunks of KV blocks with an online softmax (running max, running sum,
rescaled accumulator), so transient memory is bounded by
`attention_tiles.CHUNK_BUDGET_BYTES`, whatever max_model_len is. Every shape
comes from Python ints (tokens and rows padded, heads, block size,
max_model_len) and nothing reads a tensor value on the host, so FULL and
PIECEWISE graphs capture it unchanged.

Why tiles of one request (see `attention_tiles`). A token attends only to its
own request's context, and the batch mixes requests of different query
lengths. Gathering the context per token costs T contexts (2048 for a
prefill chunk: 34 GB of K per layer for 8B at 8192); gathering it per row and
scoring every token against every row wastes R-fold FLOPs, and non-uniform
batches are padded to R = min(max_num_seqs, T) rows (32x at 8B's 2048-token
prefill). Tiles of ceil(T / R) consecutive tokens of one request cost at most
about 2x in both: a decode batch of R requests x q tokens is about R tiles of q,
a prefill chunk is about R tiles of T / R tokens, each one GEMM against one
gathered context chunk.

GQA without expansion: the G = H / KVH query heads of a KV head are rows of the
same GEMM ([KVH * tiles, G * tile_len, D] x [KVH * tiles, D, chunk]).

Memory, per call, with NT tiles of Tq slots (NT * Tq <= T + R * Tq, about 2T):
chunk * NT * (KVH * (D * itemsize + 4 * (D + 4)) + Tq * (4 * H + 3)) bytes for a
chunk (K then V as gathered, their fp32 staging, fp32 scores, masks), kept under
the budget with at least one block per chunk, plus per-slot state independent of
the context: q and the accumulator in fp32, NT * Tq * H * (2D + 4) * 4 bytes,
and the output. Nothing is sized by max_model_len except the number of chunks.

One forward, many layers: every layer reads the same metadata, so the
layer-invariant half (where tokens sit in tiles, each tile's block indices,
the causal and window bounds) is computed by the first attention call of a
forward and shared (`one_forward`, `attention_tiles.ForwardLayout`); at 8B
that took a verify forward from 3,124 kernels to 2,067.

One op per layer: the attention proper (q gathered into tiles, the chunk
loop, the output scattered back) is the custom op `parity::paged_attend`.
On the CPU it is the torch code below; on CUDA the Triton kernel of
`triton_attention`, which reads only the keys a tile may see, stages nothing
and launches once. The metadata is read, and the cache written, here in
torch on both: a fault in how metadata becomes tiles, bounds or slots
reaches either kernel the same way.

Numerics: scores, softmax and P.V in fp32 on chunk-sized pieces, output cast
to the query dtype once. Deterministic: no atomics; the only duplicate indices
are PAD writes to the trash row and idle slots' writes to a dropped row.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from transformers import AttentionInterface

from parity.models import fused_ops
from parity.models.direct_op import DirectOp
from parity.models.attention_tiles import (ForwardLayout, TilePlan, forward_layout, plan_tiles, tree_bounds,
                                          tree_hidden, window_lo)

ATTN_IMPLEMENTATION = "parity_paged"

# Set by a piecewise graph capture: called at every attention instead of attending,
# so the capture can end its piece there (see parity/graphs/capture.py).
_SPLIT_HOOK: contextvars.ContextVar = contextvars.ContextVar("parity_attention_split", default=None)

# Set by `one_forward`: the layouts of the forward in progress, shared by its attention calls.
_FORWARD_LAYOUTS: contextvars.ContextVar = contextvars.ContextVar("parity_forward_layouts", default=None)

# Floor of the running max: a row whose keys so far are all masked gets
# exp(-inf - floor) = 0 instead of exp(-inf + inf) = NaN. Real scores are far above it.
_MAX_FLOOR = -1e30


@contextlib.contextmanager
def split_at_attention(hook):
    """Within this block every paged attention call is handed to `hook(module, q, k, v, scaling, meta)`."""
    token = _SPLIT_HOOK.set(hook)
    try:
        yield
    finally:
        _SPLIT_HOOK.reset(token)


@contextlib.contextmanager
def one_forward():
    """The attention calls inside are one forward's: they share its layout (`attention_tiles.ForwardLayout`).

    Whoever runs a forward opens it (the target model's forward, a piecewise
    replay); attention outside one computes its layout itself. A forward's
    metadata must not change between its layers; between forwards it may
    (draft steps update it in place), so a layout never outlives its forward.
    """
    token = _FORWARD_LAYOUTS.set({})
    try:
        yield
    finally:
        _FORWARD_LAYOUTS.reset(token)


def _cache_rows(cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    # PAD_SLOT is -1, and -1 mod (num_slots + 1) is the trash row: one kernel, no where().
    return slot_mapping.remainder(cache.shape[0])


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor) -> None:
    """Scatter each token's key and value [T, KVH, D] into its slot of the caches [num_slots + 1, KVH, D].

    PAD slots (-1) land in the trash row at the end of the cache, so padded
    tokens never touch a real slot.
    """
    rows = _cache_rows(k_cache, slot_mapping)
    k_cache.index_copy_(0, rows, key)
    v_cache.index_copy_(0, rows, value)


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
    k_cache, v_cache = kv.keys[layer], kv.values[layer]
    _, heads, num_tokens, head_dim = query.shape
    kv_heads = key.shape[1]
    if scaling is None:
        scaling = head_dim ** -0.5
    write_kv(k_cache, v_cache, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))

    plan = plan_tiles(num_tokens, meta.seq_lens.shape[0], heads, kv_heads, head_dim, k_cache.element_size(),
                      meta.block_size, meta.max_model_len, meta.block_table.shape[1])
    layout = _layout(meta, plan)
    lo = window_lo(layout, meta, plan) if meta.window_for_layer(layer) else None
    out = paged_attend(query[0].transpose(0, 1), k_cache, v_cache, layout.slot_tokens, layout.target,
                       layout.blocks, tree_bounds(layout, meta, plan), lo, scaling, plan.tile_len, plan.chunks[0][1],
                       meta.block_size, layout.tree_base, layout.tree_bits)
    return out[:num_tokens].view(1, num_tokens, heads, head_dim)


def _layout(meta, plan: TilePlan) -> ForwardLayout:
    """This forward's layout for `plan`: computed by its first attention call, shared by the others."""
    shared = _FORWARD_LAYOUTS.get()
    if shared is None:
        return forward_layout(meta, plan)
    key = (id(meta), plan)
    if key not in shared:
        shared[key] = (meta, forward_layout(meta, plan))   # meta held: its id stays unique in the forward
    return shared[key][1]


def _paged_attend(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_tokens: torch.Tensor,
                 target: torch.Tensor, blocks: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                 scaling: float, tile_len: int, chunk_blocks: int, block_size: int,
                 tree_base: torch.Tensor | None = None, tree_bits: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of query [T, H, D] over the tiles' contexts: [T + 1, H, D], row T and padded tokens zero.

    One op (see `fused_ops` for why a custom op): the torch implementation
    below on the CPU, the Triton kernel of `triton_attention` on CUDA (the
    torch one for tree drafts, whose mask the kernel does not read).
    """
    return torch_paged_attend(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo, scaling, tile_len,
                              chunk_blocks, block_size, tree_base, tree_bits)


paged_attend = DirectOp("parity::paged_attend", _paged_attend)


def torch_paged_attend(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo, scaling: float, tile_len: int,
                       chunk_blocks: int, block_size: int, tree_base=None, tree_bits=None) -> torch.Tensor:
    """`paged_attend` in torch ops: the context in chunks of `chunk_blocks` blocks with an online softmax."""
    num_tokens, heads, head_dim = query.shape
    kv_heads = k_cache.shape[1]
    groups = heads // kv_heads
    num_tiles = blocks.shape[0]
    batch, rows_per_tile = kv_heads * num_tiles, groups * tile_len

    # NOTE: gathers and scatters here are index_select / index_copy_, not advanced
    # indexing with broadcast index tensors: CUDA's index kernel takes a small
    # temporary from the caching allocator, which a CUDA graph pool would hold.
    # q of every slot, laid out [KVH, tiles, G, tile_len, D]: one GEMM batch per (KV head, tile).
    # Gathered along tokens, the outermost dim of q's memory ([T, H, D] as the projection wrote it):
    # whole rows, not a strided gather; the layout change happens in the fp32 copy.
    gathered = query.index_select(0, slot_tokens)    # [slots, H, D]
    q = query.new_empty((kv_heads, num_tiles, groups, tile_len, head_dim), dtype=torch.float32)
    q.copy_(gathered.view(num_tiles, tile_len, kv_heads, groups, head_dim).permute(2, 0, 3, 1, 4))   # one copy
    q = q.view(batch, rows_per_tile, head_dim).mul_(scaling)

    tree = None if tree_base is None else (tree_base, tree_bits)
    acc = _attend(q, k_cache, v_cache, blocks, hi, lo, tile_len, chunk_blocks, block_size, kv_heads, groups, tree)

    # The max key of a row contributes exp(0) = 1, so the sum is >= 1 wherever a
    # key was valid and exactly 0 where none was (acc is 0 there too): the clamp
    # turns 0/0 into 0 and changes nothing else. The division computes in fp32
    # and writes the query dtype directly, rounding once.
    values = query.new_empty((batch, rows_per_tile, head_dim))
    torch.div(acc[:, :, :head_dim], acc[:, :, head_dim:head_dim + 1].clamp_min_(1.0), out=values)
    values = values.view(kv_heads, num_tiles, groups, tile_len, head_dim).permute(1, 3, 0, 2, 4)
    out = query.new_zeros((num_tokens + 1, kv_heads, groups, head_dim))
    # Idle slots write to the extra row num_tokens.
    out.index_copy_(0, target, values.reshape(num_tiles * tile_len, kv_heads, groups, head_dim))
    return out.view(num_tokens + 1, heads, head_dim)


def _attend(q, k_cache, v_cache, blocks, hi, lo, tile_len: int, chunk_blocks: int, block_size: int,
            kv_heads: int, groups: int, tree=None) -> torch.Tensor:
    """Online softmax over the context chunks: [KVH * tiles, G * tile_len, D + 4] (P.V | softmax sum).

    `tree`: (base, bits) per slot, tree drafts only: key j >= base is seen only where bit j - base is set."""
    batch, _, head_dim = q.shape
    num_tiles, num_blocks = blocks.shape
    # [num_blocks, block_size, KVH, D] views: a chunk is one index_select of whole blocks, each
    # contiguous in memory (measured at 8B, batch 32: a gather along a strided dim took 5x longer).
    k_blocks = k_cache[:-1].unflatten(0, (-1, block_size))
    v_blocks = v_cache[:-1].unflatten(0, (-1, block_size))
    # fp32 staging of one chunk, K then V: [K or V | 1 1 1 1]. P.[V | 1] accumulates the
    # softmax sum in the output's GEMM and rescale (no sum, mul, add per chunk); rows of
    # D + 4 floats keep the GEMM operands 16-byte aligned.
    stage = torch.empty(batch, min(chunk_blocks, num_blocks) * block_size, head_dim + 4, dtype=torch.float32,
                        device=q.device)
    stage[:, :, head_dim:].fill_(1.0)
    bound = hi.view(num_tiles, 1, tile_len, 1)
    start = lo.view(num_tiles, 1, tile_len, 1) if lo is not None else None
    run_max = acc = None
    for first in range(0, num_blocks, chunk_blocks):
        n = min(chunk_blocks, num_blocks - first)
        chunk = n * block_size
        chunk_ids = blocks[:, first:first + n].reshape(-1)
        # The keys each slot must not see: past its bound, before its window start.
        j = torch.arange(first * block_size, first * block_size + chunk, device=q.device)
        masked = j > bound
        if start is not None:
            masked |= j < start
        if tree is not None:
            masked |= tree_hidden(j, tree, num_tiles, tile_len)
        staged = stage[:, :chunk]
        kv_part = staged[:, :, :head_dim]
        _stage(kv_part, k_blocks, chunk_ids, kv_heads, num_tiles)
        scores = torch.bmm(q, kv_part.transpose(1, 2))     # [KVH * tiles, G * tile_len, chunk]
        scores.view(kv_heads, num_tiles, groups, tile_len, chunk).masked_fill_(masked, float("-inf"))
        chunk_max = scores.amax(dim=-1, keepdim=True)
        if run_max is None:
            new_max = chunk_max.clamp_min_(_MAX_FLOOR)
        else:
            new_max = torch.maximum(run_max, chunk_max)
            rescale = run_max.sub_(new_max).exp_()
        probs = scores.sub_(new_max).exp_()
        _stage(kv_part, v_blocks, chunk_ids, kv_heads, num_tiles)
        if acc is None:
            acc = torch.bmm(probs, staged)                  # [KVH * tiles, G * tile_len, D + 4]
        else:
            acc.mul_(rescale).baddbmm_(probs, staged)
        run_max = new_max
        del probs, scores

    return acc


def _stage(kv_part: torch.Tensor, cache_blocks: torch.Tensor, blocks: torch.Tensor, kv_heads: int,
           num_tiles: int) -> None:
    """Gather the chunk's blocks ([tiles * n, block_size, KVH, D]) and copy them, as
    [KVH, tiles, chunk, D] in fp32, into the staging rows `kv_part` [KVH * tiles, chunk, D]."""
    chunk, head_dim = kv_part.shape[1], kv_part.shape[2]
    gathered = cache_blocks.index_select(0, blocks).view(num_tiles, chunk, kv_heads, head_dim)
    kv_part.unflatten(0, (kv_heads, num_tiles)).copy_(gathered.permute(2, 0, 1, 3))


if fused_ops.HAS_TRITON:
    @paged_attend.register_kernel("cuda")
    def _(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo, scaling, tile_len, chunk_blocks,
          block_size, tree_base=None, tree_bits=None):
        from parity.models import triton_attention
        if tree_base is not None or not triton_attention.supports(query, k_cache):
            return torch_paged_attend(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo, scaling,
                                      tile_len, chunk_blocks, block_size, tree_base, tree_bits)
        return triton_attention.paged_attend(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo,
                                             scaling, tile_len, block_size)


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
