"""Where a forward's tokens sit in the attention tiles (`attention_tiles.tile_layout`), in one Triton kernel.

The torch implementation places the tokens in tiles with twelve to twenty
small integer kernels (prefix max and sum over the rows, searchsorted,
gathers, clamps, a masked fill, the blocks' gather); on a draft step of an
8B head, whose GEMMs take about 0.3 ms, they and the replay's gaps between
them were about a sixth of its time. This kernel computes the same integers:
each program takes a block of slots, rebuilds the rows' spans from
`query_start_loc` in registers (the prefix max and sum of a short vector),
finds each slot's row by counting the span ends at or below it (what
searchsorted returns on a sorted vector), and writes the slot's token,
output row and causal bound (its token's position, within its tile's row's
context) and, from the first slot of each tile, the tile's row and KV
blocks. Integer arithmetic throughout: the results are
the torch implementation's bit for bit, on good metadata and on the broken
metadata a fault under test hands in (`tests/test_gpu_tile_layout.py`).

Only the CUDA implementation of `attention_tiles.tile_layout` calls it; the
module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _layout_kernel(qsl_ptr, table_ptr, table_stride, seq_lens_ptr, positions_ptr, slot_tokens_ptr, target_ptr,
                   tile_row_ptr, blocks_ptr, hi_ptr, num_rows, num_tokens, num_slots, num_blocks, tile_len,
                   num_positions, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_B: tl.constexpr):
    r = tl.arange(0, BLOCK_R)
    row_in = r < num_rows                   # entries past the rows are never read below
    # The rows' bounds as tile_map forces them: a prefix max of query_start_loc, clamped to the batch.
    # starts[r] = max(qsl[0..r]), ends[r] = max(qsl[0..r+1]).
    first = tl.load(qsl_ptr).to(tl.int64)
    starts = tl.associative_scan(tl.load(qsl_ptr + r, mask=row_in, other=0).to(tl.int64), 0, _max)
    ends = tl.maximum(tl.associative_scan(tl.load(qsl_ptr + r + 1, mask=row_in, other=0).to(tl.int64), 0, _max),
                      first)
    starts = tl.minimum(starts, num_tokens)
    ends = tl.minimum(ends, num_tokens)
    # Row r's span in tile space ends at its last token plus the padding of rows 0..r (torch.remainder: the
    # non-negative residue; 0 when tiles are single tokens, where the span ends are the rows' ends).
    pad = (starts - ends) % tile_len
    pad = tl.where(row_in, tl.where(pad < 0, pad + tile_len, pad), 0)
    pad_end = tl.cumsum(pad, 0)
    shift = pad - pad_end
    searched = r < num_rows - 1             # searchsorted over every row's span end but the last
    bound = tl.where(searched, ends + pad_end, 0)

    u = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    slot_in = u < num_slots
    u64 = u.to(tl.int64)
    row = tl.sum((searched[None, :] & (bound[None, :] <= u64[:, None])).to(tl.int64), 1)
    one_hot = r[None, :] == row[:, None]
    token = u64 + tl.sum(tl.where(one_hot, shift[None, :], 0), 1)
    idle = token >= tl.sum(tl.where(one_hot, ends[None, :], 0), 1)
    token = tl.minimum(token, num_tokens - 1)
    tl.store(slot_tokens_ptr + u, token, mask=slot_in)
    tl.store(target_ptr + u, tl.where(idle, num_tokens, token), mask=slot_in)

    # A tile's row is its first slot's; that slot writes the row and the row's KV blocks.
    tile = u // tile_len
    head = (tile * tile_len).to(tl.int64)
    tile_row = tl.sum((searched[None, :] & (bound[None, :] <= head[:, None])).to(tl.int64), 1)
    leads = slot_in & (u64 == head)
    tl.store(tile_row_ptr + tile, tile_row, mask=leads)
    # The last key the slot may see: its token's position, within its tile's row's context.
    position = tl.load(positions_ptr + token, mask=slot_in & (token >= 0) & (token < num_positions), other=0)
    seq_len = tl.load(seq_lens_ptr + tile_row, mask=slot_in, other=0)
    hi = tl.minimum(position.to(tl.int64), seq_len.to(tl.int64) - 1)
    tl.store(hi_ptr + u, hi.to(hi_ptr.dtype.element_ty), mask=slot_in)
    for b0 in range(0, num_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        both = leads[:, None] & (b[None, :] < num_blocks)
        blocks = tl.load(table_ptr + tile_row[:, None] * table_stride + b[None, :], mask=both, other=0)
        tl.store(blocks_ptr + tile[:, None].to(tl.int64) * num_blocks + b[None, :], blocks, mask=both)


def tile_layout(query_start_loc: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                positions: torch.Tensor, num_tokens: int, tile_len: int, num_tiles: int,
                num_blocks: int) -> tuple[torch.Tensor, ...]:
    """(slot tokens [S], output rows [S], tile rows [tiles], KV blocks [tiles, num_blocks], causal bounds [tiles,
    tile_len]), S = num_tiles * tile_len: `attention_tiles._torch_tile_layout`'s values and dtypes (every input
    int32 or int64, query_start_loc, seq_lens and positions contiguous, the table's rows contiguous, at least one
    row)."""
    num_rows, num_slots = query_start_loc.shape[0] - 1, num_tiles * tile_len
    device = query_start_loc.device
    slot_tokens = torch.empty(num_slots, dtype=torch.int64, device=device)
    target = torch.empty(num_slots, dtype=torch.int64, device=device)
    tile_row = torch.empty(num_tiles, dtype=torch.int64, device=device)
    blocks = torch.empty((num_tiles, num_blocks), dtype=block_table.dtype, device=device)
    hi = torch.empty((num_tiles, tile_len), dtype=torch.promote_types(positions.dtype, seq_lens.dtype),
                     device=device)
    block_r = triton.next_power_of_2(num_rows)
    block_s = max(16, min(128, 4096 // block_r))
    _layout_kernel[(triton.cdiv(num_slots, block_s),)](
        query_start_loc, block_table, block_table.stride(0), seq_lens, positions, slot_tokens, target, tile_row,
        blocks, hi, num_rows, num_tokens, num_slots, num_blocks, tile_len, positions.shape[0], BLOCK_R=block_r,
        BLOCK_S=block_s, BLOCK_B=64)
    return slot_tokens, target, tile_row, blocks, hi
