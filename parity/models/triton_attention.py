"""The CUDA implementation of `parity::paged_attend`: one Triton kernel per attention call.

It takes what the torch implementation takes (the layout `attention_tiles`
computed from the metadata: each slot's token and output row, each tile's KV
blocks, each slot's key bounds) and computes the same thing without staging
anything: a program owns up to BLOCK_M query rows of one (tile, KV head),
the G query heads of that KV head for the tile's tokens, so GQA needs no
expansion; it walks the tile's blocks BLOCK_N keys at a time with an online
softmax and stops after the last key any of its rows may see, so a request
costs its own context, not max_model_len. Scores in fp32 (bf16 products are
exact in fp32); P.V with P split into a high and a low bf16 part and fp32
accumulation (P rounded to bf16 once, as FlashAttention does, was 3% off a
float64 reference at head_dim 128); fp32 models use IEEE fp32 dots throughout.

Deterministic: no atomics, each output row written by one program, idle
slots (target == T) write nothing, so the extra row T stays zero.

Graph-capturable: every shape and loop bound that Python sees is an int of
the plan; the data-dependent bounds (how many keys a tile sees) are read on
the device.

Compiled once per model shape (dtype, head dim, GQA groups, block size,
window or not) and row-block size: the tile length is a runtime argument, so
the padded shapes of a run, each with its own tile length, share one binary
(as a compile-time constant every capture size compiled its own kernel, in
every process of a multi-process test run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAX_FLOOR = tl.constexpr(-1e30)   # the floor of the running max (see paged_attention)


@triton.jit
def _key_step(q, acc, run_max, run_sum, k_ptr, v_ptr, block_row, stride_bb, first, end, hi, lo, kv_head, scale,
              stride_ct, stride_ch, d, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LO: tl.constexpr,
              IEEE: tl.constexpr):
    """Keys first .. first + BLOCK_N of the tile folded into the online softmax of its rows."""
    j = first + tl.arange(0, BLOCK_N)
    inside = j < end
    block = tl.load(block_row + (j // BLOCK_SIZE) * stride_bb, mask=inside, other=0).to(tl.int64)
    cache_row = block * BLOCK_SIZE + j % BLOCK_SIZE
    kv_offs = cache_row[:, None] * stride_ct + kv_head * stride_ch + d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=inside[:, None], other=0.0)
    if IEEE:
        scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    scores = scores * scale
    masked = (j[None, :] > hi[:, None]) | (~inside[None, :])
    if HAS_LO:
        masked = masked | (j[None, :] < lo[:, None])
    scores = tl.where(masked, float("-inf"), scores)
    new_max = tl.maximum(run_max, tl.max(scores, axis=1))
    rescale = tl.exp(run_max - new_max)
    probs = tl.exp(scores - new_max[:, None])
    run_sum = run_sum * rescale + tl.sum(probs, axis=1)
    v = tl.load(v_ptr + kv_offs, mask=inside[:, None], other=0.0)
    if IEEE:
        acc = acc * rescale[:, None] + tl.dot(probs, v.to(tl.float32), input_precision="ieee")
    else:
        # P as the sum of two cache-dtype parts (high and low bits): P.V with P good to
        # about 16 bits, at twice a tensor-core dot, instead of P rounded to 8 bits.
        probs_hi = probs.to(v.dtype)
        probs_lo = (probs - probs_hi.to(tl.float32)).to(v.dtype)
        acc = tl.dot(probs_lo, v, acc=tl.dot(probs_hi, v, acc=acc * rescale[:, None]))
    return acc, new_max, run_sum


@triton.jit
def _paged_attend_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slot_ptr, target_ptr, blocks_ptr, hi_ptr, lo_ptr,
                         num_tokens, num_blocks, tile_len, scale,
                         stride_qt, stride_qh, stride_ct, stride_ch, stride_ot, stride_oh,
                         stride_bt, stride_bb, stride_ht, stride_hs, stride_lt, stride_ls,
                         GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_LO: tl.constexpr, IEEE: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = rows < GROUPS * tile_len
    in_tile = rows % tile_len
    slot = tile * tile_len + in_tile
    token = tl.load(slot_ptr + slot, mask=live, other=0).to(tl.int64)
    head = kv_head * GROUPS + rows // tile_len
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=live[:, None], other=0.0)
    if IEEE:
        q = q.to(tl.float32)
    # The bounds and the blocks by their strides: a broadcast or sliced bound reads what torch's path reads.
    hi = tl.load(hi_ptr + tile.to(tl.int64) * stride_ht + in_tile * stride_hs, mask=live, other=-1)
    # Keys 0 .. the largest bound of the rows; with a window, from the smallest start.
    end = tl.minimum(tl.max(hi, axis=0) + 1, num_blocks * BLOCK_SIZE)
    start = 0
    lo = hi
    if HAS_LO:
        lo = tl.load(lo_ptr + tile.to(tl.int64) * stride_lt + in_tile * stride_ls, mask=live, other=2147483647)
        start = (tl.maximum(tl.min(lo, axis=0), 0) // BLOCK_N) * BLOCK_N
    run_max = tl.full((BLOCK_M,), _MAX_FLOOR, tl.float32)
    run_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    block_row = blocks_ptr + tile.to(tl.int64) * stride_bt
    for first in range(start, end, BLOCK_N):
        acc, run_max, run_sum = _key_step(q, acc, run_max, run_sum, k_ptr, v_ptr, block_row, stride_bb, first, end,
                                          hi, lo, kv_head, scale, stride_ct, stride_ch, d, BLOCK_SIZE, BLOCK_N,
                                          HAS_LO, IEEE)
    # A row that saw no key has sum 0 and acc 0: it writes 0.
    values = acc / tl.maximum(run_sum, 1e-30)[:, None]
    target = tl.load(target_ptr + slot, mask=live, other=num_tokens).to(tl.int64)
    keep = live & (target < num_tokens)
    tl.store(out_ptr + target[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             values.to(out_ptr.dtype.element_ty), mask=keep[:, None])


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Shapes the kernel handles: head_dim a power of two of at least 16, caches with contiguous rows."""
    head_dim = query.shape[-1]
    return (head_dim >= 16 and head_dim & (head_dim - 1) == 0 and query.stride(-1) == 1
            and k_cache.stride(-1) == 1 and query.dtype == k_cache.dtype)


def paged_attend(query, k_cache, v_cache, slot_tokens, target, blocks, hi, lo, scaling: float,
                 tile_len: int, block_size: int) -> torch.Tensor:
    """[T + 1, H, D]: attention of every real token in row `target`, row T and padded tokens zero."""
    num_tokens, heads, head_dim = query.shape
    kv_heads = k_cache.shape[1]
    groups = heads // kv_heads
    num_tiles, num_blocks = blocks.shape
    out = torch.zeros((num_tokens + 1, heads, head_dim), dtype=query.dtype, device=query.device)
    ieee = query.dtype == torch.float32
    rows = groups * tile_len
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    block_n = 32 if ieee else 64
    grid = (num_tiles, kv_heads, triton.cdiv(rows, block_m))
    bound = lo if lo is not None else hi
    _paged_attend_kernel[grid](
        query, k_cache, v_cache, out, slot_tokens, target, blocks, hi, bound,
        num_tokens, num_blocks, tile_len, scaling,
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        blocks.stride(0), blocks.stride(1), hi.stride(0), hi.stride(1), bound.stride(0), bound.stride(1),
        GROUPS=groups, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_M=block_m,
        BLOCK_N=block_n, HAS_LO=lo is not None, IEEE=ieee, num_warps=4)
    return out
