"""Static tiling for paged attention: query tiles of one request each, context chunks.

A batch is T query tokens (padded) in R request rows (padded); row r owns the
tokens query_start_loc[r] .. query_start_loc[r+1]. Attention cuts every row
into tiles of `tile_len` consecutive tokens, gathers each tile's context once
per chunk of KV blocks, and scores the tile's tokens against it with one GEMM.

Everything here that decides a shape is a Python int computed from other
Python ints (T, R, heads, block size, max_model_len), so a graph captures it;
`tile_map` then places the real tokens in those static tiles on the device,
with no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.models.direct_op import DirectOp
from parity.models.fused_ops import HAS_TRITON

# Bytes the per-chunk working set of one attention call may take (K or V as
# gathered, their fp32 staging, scores, masks). The chunk length follows from
# it, so transient memory does not grow with max_model_len. Tests lower it to
# force many chunks; a larger value means fewer chunks, so fewer kernels per
# layer (about 17 per extra chunk).
CHUNK_BUDGET_BYTES = 512 << 20


@dataclass(frozen=True)
class TilePlan:
    num_tokens: int     # T, padded
    num_rows: int       # R, padded
    tile_len: int       # tokens per tile; a tile never spans two requests
    num_tiles: int      # static bound on the tiles any batch of this shape fills
    chunks: tuple[tuple[int, int], ...]   # (first block, blocks) of each context chunk
    bytes_per_key: int  # the working set per key position of a chunk

    @property
    def num_slots(self) -> int:
        return self.num_tiles * self.tile_len

    @property
    def num_blocks(self) -> int:
        return sum(n for _, n in self.chunks)


def plan_tiles(num_tokens: int, num_rows: int, heads: int, kv_heads: int, head_dim: int,
               cache_itemsize: int, block_size: int, max_model_len: int, table_width: int,
               budget: int | None = None) -> TilePlan:
    """The static shapes of one attention call.

    Tiles: row r needs ceil(q_r / tile_len) tiles, so a batch needs at most
    (T + k * (tile_len - 1)) // tile_len of them, k = min(R, T) non-empty rows,
    and never more than T. tile_len = ceil(T / R) keeps both the padded query
    slots (num_tiles * tile_len) and the context gathers (num_tiles) within
    about 2x of the rows' own: decode (T = q * R) gets tiles of q tokens, a
    chunked prefill gets tiles of T / R tokens.

    Chunks: whole blocks, as many per chunk as the budget allows for the
    working set below (at least one block); the last chunk takes the rest.
    """
    budget = CHUNK_BUDGET_BYTES if budget is None else budget
    tile_len = max(1, -(-num_tokens // max(1, num_rows)))
    busy_rows = min(num_rows, num_tokens)
    num_tiles = max(1, min(num_tokens, (num_tokens + busy_rows * (tile_len - 1)) // tile_len))
    # Per key position and tile: K (then V) gathered as stored, the fp32 staging
    # row of D + 4 floats, the fp32 scores (exp'd in place), three boolean masks.
    per_key = num_tiles * (kv_heads * (head_dim * cache_itemsize + (head_dim + 4) * 4) + tile_len * (heads * 4 + 3))
    num_blocks = min(table_width, -(-max_model_len // block_size))
    per_chunk = max(1, min(num_blocks, budget // (per_key * block_size)))
    chunks = tuple((b, min(per_chunk, num_blocks - b)) for b in range(0, num_blocks, per_chunk))
    return TilePlan(num_tokens, num_rows, tile_len, num_tiles, chunks, per_key)


@dataclass
class TileMap:
    token: torch.Tensor     # [num_tiles, tile_len] token of each slot (idle ones clamped into [0, T))
    idle: torch.Tensor      # [num_tiles, tile_len] the slot holds no token (past its row's end)
    tile_row: torch.Tensor  # [num_tiles] request row of each tile


def prefix(x: torch.Tensor, op: str) -> torch.Tensor:
    """Inclusive prefix max or sum of a short integer vector (one entry per request), without a scan kernel.

    CUDA's scans take temporary storage from the caching allocator, which inside
    a capture is a block of the graph's pool that the emulated pool never sees
    (the two backends' pools would part). A masked reduction over a lower
    triangle gives the same integers and allocates only tensors both backends see.
    """
    n = x.shape[0]
    lower = torch.ones(n, n, dtype=torch.bool, device=x.device).tril_()
    if op == "max":
        return torch.where(lower, x.unsqueeze(0), torch.iinfo(x.dtype).min).amax(dim=1)
    return torch.where(lower, x.unsqueeze(0), 0).sum(dim=1)


def tile_map(meta, plan: TilePlan) -> TileMap:
    """Place the batch's tokens in the plan's tiles, on the device.

    In tile space row r spans ceil(q_r / tile_len) * tile_len slots from the
    cumulative offset of the rows before it; slot u belongs to the row whose
    span holds it and stands for token u + (start_r - offset_r). Slots
    past the rows' spans and past a row's last token are idle. Padded rows
    (q_r = 0) get no tiles; padded tokens (past query_start_loc[num_reqs]) get
    no slot, so their output stays 0.
    """
    return _tile_map(meta.query_start_loc, plan.num_tokens, plan.tile_len, plan.num_tiles)


def _tile_map(query_start_loc: torch.Tensor, num_tokens: int, tile_len: int, num_tiles: int) -> TileMap:
    # NOTE: good metadata has 0 = qsl[0] <= qsl[1] <= ... <= T; a stale
    # query_start_loc (a fault under test) need not. Forcing that shape, a no-op
    # on good metadata, keeps the rows' token ranges disjoint and inside the
    # batch, so no token is written twice (which a GPU would do in any order).
    qsl = prefix(query_start_loc, "max").clamp_(max=num_tokens)
    starts, ends = qsl[:-1], qsl[1:]
    slots = torch.arange(num_tiles * tile_len, device=qsl.device)
    # Searching the rows' ends but the last puts every slot in a row: slots past
    # every span land in the last row, past its end, so they are idle.
    if tile_len == 1:
        # Tile space is token space (query_start_loc[0] is 0).
        row = torch.searchsorted(ends[:-1], slots, right=True)
        token = slots
    else:
        # Row r is padded by (-q_r) mod tile_len slots; its span ends at its last
        # token plus the padding of rows 0..r, and its tokens sit shifted by the
        # padding of the rows before it.
        pad = torch.remainder(starts - ends, tile_len)
        pad_end = prefix(pad, "sum")
        span_end = ends + pad_end
        shift = pad - pad_end
        row = torch.searchsorted(span_end[:-1], slots, right=True)
        token = slots + shift[row]
    idle = token >= ends[row]
    # Real tokens lie in [0, T); idle slots may point past the end.
    token = token.clamp_(max=num_tokens - 1)
    shape = (num_tiles, tile_len)
    return TileMap(token.view(shape), idle.view(shape), row.view(shape)[:, 0])


def _torch_tile_layout(query_start_loc: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                       positions: torch.Tensor, num_tokens: int, tile_len: int, num_tiles: int,
                       num_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the tokens sit in the tiles: (the token each slot gathers [slots], each slot's output row [slots]:
    its token, or T (dropped) when idle, each tile's request row [tiles], the KV blocks each tile gathers
    [tiles, num_blocks], the last key position each slot may see [tiles, tile_len]: its token's position, within
    its row's context)."""
    tiles = _tile_map(query_start_loc, num_tokens, tile_len, num_tiles)
    target = tiles.token.masked_fill(tiles.idle, num_tokens).flatten()
    blocks = block_table[:, :num_blocks].index_select(0, tiles.tile_row)
    # Key positions j a slot may see: j <= hi (causal, inside its request).
    seq_len = seq_lens.index_select(0, tiles.tile_row).unsqueeze(1)
    hi = torch.minimum(positions.index_select(0, tiles.token.flatten()).view(num_tiles, tile_len), seq_len - 1)
    return tiles.token.flatten(), target, tiles.tile_row.contiguous(), blocks, hi


# One op (on CUDA one kernel, `triton_layout`) where tile_map, the blocks' gather and the causal bound are a dozen
# kernels or more.
tile_layout = DirectOp("parity::tile_layout", _torch_tile_layout)

if HAS_TRITON:
    @tile_layout.register_kernel("cuda")
    def _(query_start_loc, block_table, seq_lens, positions, num_tokens, tile_len, num_tiles, num_blocks):
        args = (query_start_loc, block_table, seq_lens, positions, num_tokens, tile_len, num_tiles, num_blocks)
        if not (query_start_loc.shape[0] > 1 and query_start_loc.is_contiguous() and block_table.stride(1) == 1
                and seq_lens.dim() == 1 and seq_lens.stride(0) == 1 and positions.dim() == 1
                and positions.stride(0) == 1 and {query_start_loc.dtype, block_table.dtype, seq_lens.dtype,
                                                  positions.dtype} <= {torch.int32, torch.int64}):
            return _torch_tile_layout(*args)
        from parity.models import triton_layout
        return triton_layout.tile_layout(*args)


@dataclass
class ForwardLayout:
    """The layer-invariant half of attention: computed once per forward, read by every layer.

    Every layer of a forward reads the same metadata, so where the tokens sit
    in the tiles, which KV blocks each tile gathers and which keys each slot
    may see are the same for all of them (about 30 kernels a layer when each
    layer recomputed them). `lo` is computed by the first window layer.
    """

    slot_tokens: torch.Tensor           # [slots] token each slot gathers (idle ones clamped into [0, T))
    target: torch.Tensor                # [slots] output row of each slot: its token, or T (dropped) when idle
    tile_row: torch.Tensor              # [tiles] request row of each tile
    blocks: torch.Tensor                # [tiles, plan.num_blocks] KV blocks each tile gathers, in order
    hi: torch.Tensor                    # [tiles, tile_len] last key position each slot may see
    lo: torch.Tensor | None = None      # [tiles, tile_len] first key position each slot may see on window layers
    tree_base: torch.Tensor | None = None   # [tiles, tile_len] tree drafts: first tree key of each slot's tree
    tree_bits: torch.Tensor | None = None   # [tiles, tile_len] tree drafts: which tree keys the slot sees


def forward_layout(meta, plan: TilePlan) -> ForwardLayout:
    """Tiles, block indices and the causal bound of `meta`'s batch, on the device."""
    # Key positions j a slot may see: lo <= j <= hi (hi: causal, inside its request; lo: in its window).
    slot_tokens, target, tile_row, blocks, hi = tile_layout(meta.query_start_loc, meta.block_table, meta.seq_lens,
                                                            meta.positions, plan.num_tokens, plan.tile_len,
                                                            plan.num_tiles, plan.num_blocks)
    return ForwardLayout(slot_tokens, target, tile_row, blocks, hi)


def window_lo(layout: ForwardLayout, meta, plan: TilePlan) -> torch.Tensor:
    """The window start of every slot ([tiles, tile_len]), computed once per forward."""
    if layout.lo is None:
        layout.lo = meta.window_starts().index_select(0, layout.slot_tokens).view(plan.num_tiles, plan.tile_len)
    return layout.lo


def tree_bounds(layout: ForwardLayout, meta, plan: TilePlan) -> torch.Tensor:
    """Tree drafts: the causal bound of every slot ([tiles, tile_len]), computed once per forward.

    A tree node's key sits at its sequence index (`meta.tree_seq`), past the
    rotary position (its depth) the causal bound of `forward_layout` read; the
    tree's first key and the bits of the nodes each slot sees go with it
    (`tree_hidden`). Without a tree, the layout's bound as it is.
    """
    if getattr(meta, "tree_bits", None) is None:
        return layout.hi
    if layout.tree_bits is None:
        shape = (plan.num_tiles, plan.tile_len)
        seq_len = meta.seq_lens.index_select(0, layout.tile_row).unsqueeze(1)
        layout.hi = torch.minimum(meta.tree_seq.index_select(0, layout.slot_tokens).view(shape), seq_len - 1)
        layout.tree_base = meta.tree_base.index_select(0, layout.slot_tokens).view(shape)
        layout.tree_bits = meta.tree_bits.index_select(0, layout.slot_tokens).view(shape)
    return layout.hi


def tree_hidden(j: torch.Tensor, tree, num_tiles: int, tile_len: int) -> torch.Tensor:
    """Which keys `j` [chunk] the tree mask hides from each slot: [tiles, 1, tile_len, chunk] bool.

    A slot sees the keys before its tree's base (the context) and, past it, only
    the nodes whose bit is set in its `bits` (its ancestors and itself); keys
    past its own bound are hidden by the causal mask already, so the shift is
    clamped into the int64 range (a tree has at most 63 nodes).
    """
    base = tree[0].view(num_tiles, 1, tile_len, 1)
    bits = tree[1].view(num_tiles, 1, tile_len, 1)
    offset = (j - base).clamp_(0, 62)
    return (j >= base) & (bits.bitwise_right_shift(offset).bitwise_and_(1) == 0)


def transient_bytes(plan: TilePlan, heads: int, head_dim: int, itemsize: int, block_size: int) -> int:
    """The most one attention call of this shape allocates at once (what a memory plan counts).

    The working set of its longest context chunk (`bytes_per_key` per key
    position), the per-slot state (q gathered in the query dtype and in fp32,
    the fp32 accumulator of D + 4, the result in the query dtype) and the
    output [T + 1, H, D]: an upper bound, whatever max_model_len is, and the
    torch implementation's; the Triton kernel allocates the output only. What
    the forward's layout keeps across layers (`ForwardLayout`) is a few ints
    per slot and per block.
    """
    longest = max(n for _, n in plan.chunks) * block_size
    per_slot = plan.num_slots * heads * (2 * head_dim * itemsize + (2 * head_dim + 4) * 4)
    return plan.bytes_per_key * longest + per_slot + (plan.num_tokens + 1) * heads * head_dim * itemsize
