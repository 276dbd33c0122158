"""Per-forward attention metadata: a view over persistent buffers, and its builder.

The builder never allocates a tensor a forward reads: it copy_()s host-built
values into slices of the registered buffers and hands out a view of them.
Padding is explicit and inert: every padded entry gets its buffer's declared
pad value (PAD slot -1 so writes are skipped, positions 0, seq_lens 0,
query_start_loc clamped to num_tokens).

The builder is written as a few small named steps (`padding`, `write`,
`store_block_table`, `make_view`, `store_slots`, `advance_window`) so that a
variant of the engine can replace one step without touching the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine import tree_drafter
from parity.engine.buffers import InputBuffers
from parity.engine.kv_cache import PAD_SLOT, PagedKVCache
from parity.engine.tree_metadata import TREE_FIELDS, RowTree, tree_values, tree_view

TOKEN_FIELDS = ("input_ids", "positions", "slot_mapping", "window_start")
ROW_FIELDS = ("query_start_loc", "seq_lens", "req_ids")


@dataclass
class RowPlan:
    """One request's share of a forward, built on the host."""

    req_id: int
    token_ids: list[int]       # the query tokens
    first_position: int        # position of token_ids[0]
    blocks: list[int]          # the request's KV blocks
    tree: RowTree | None = None   # tree drafts: the query's rotary positions and visible nodes

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.first_position + len(self.token_ids)


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor   # [num_reqs_padded + 1]
    seq_lens: torch.Tensor          # [num_reqs_padded]
    slot_mapping: torch.Tensor      # [num_tokens_padded]
    block_table: torch.Tensor       # [num_reqs_padded, blocks_per_seq]
    positions: torch.Tensor         # [num_tokens_padded]
    window_start: torch.Tensor      # [num_tokens_padded]
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    kv_cache: PagedKVCache
    block_size: int
    max_model_len: int
    window_layers: tuple[int, ...] = ()
    # The draft step index as a host value (the step graph reads the `draft_step` buffer).
    draft_step: int = 0
    # Tree drafts only (`tree_metadata`): each token's key index, its tree's first key, the tree keys it sees.
    tree_seq: torch.Tensor | None = None
    tree_base: torch.Tensor | None = None
    tree_bits: torch.Tensor | None = None

    def window_for_layer(self, layer: int) -> bool | None:
        return True if layer in self.window_layers else None

    def window_starts(self) -> torch.Tensor:
        """First key position each token may attend to on a sliding-window layer: [num_tokens_padded]."""
        return self.window_start


@dataclass
class HostBatch:
    """The values of one batch's metadata, on the host, before they reach the buffers."""

    values: dict[str, list[int]]   # per field: the real entries, unpadded
    block_table: torch.Tensor      # [num_reqs_padded, blocks_per_seq]
    num_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int


class MetadataBuilder:
    """Writes a batch's metadata into one owner's buffers and returns the view."""

    metadata_class = AttentionMetadata

    def __init__(self, buffers: InputBuffers, kv_cache: PagedKVCache, block_size: int,
                 max_model_len: int, sliding_window: int = 0, window_layers: tuple[int, ...] = ()):
        self.buffers = buffers
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.sliding_window = sliding_window
        self.window_layers = tuple(window_layers) if sliding_window else ()

    def slot_of(self, blocks: list[int], position: int) -> int:
        if position >= self.max_model_len:
            return PAD_SLOT
        return blocks[position // self.block_size] * self.block_size + position % self.block_size

    def window_start_of(self, position: int) -> int:
        if not self.sliding_window:
            return 0
        return max(0, position - self.sliding_window + 1)

    def write_tree(self, rows: list[RowPlan], pad: int, num_tokens: int) -> None:
        """Tree drafts: the rows' tree fields, and the rotary positions of their nodes (their depths)."""
        if "tree_bits" in self.buffers:
            for name, values in tree_values(rows, self.max_model_len).items():
                self.write(name, values, pad, num_tokens)

    # --- a batch ----------------------------------------------------------------------

    def build(self, rows: list[RowPlan], num_tokens_padded: int, num_reqs_padded: int,
              input_ids: list[int] | None = None, write_input_ids: bool = True) -> AttentionMetadata:
        """Copy `rows` into the buffers, padded to the given sizes, and return the view.

        `input_ids` overrides the rows' token ids (the drafter's shifted inputs);
        `write_input_ids=False` leaves input_ids to the device (draft decode steps).
        """
        host = self.host_batch(rows, num_reqs_padded, input_ids)
        assert host.num_tokens <= num_tokens_padded and host.num_reqs <= num_reqs_padded
        pad_tokens, pad_reqs = self.padding(host.num_tokens, num_tokens_padded, host.num_reqs, num_reqs_padded)
        for name in TOKEN_FIELDS:
            if name != "input_ids" or write_input_ids:
                self.write(name, host.values[name], pad_tokens, host.num_tokens)
        self.write_tree(rows, pad_tokens, host.num_tokens)
        for name in ROW_FIELDS:
            self.write(name, host.values[name], pad_reqs, host.num_tokens)
        meta = self.make_view(num_tokens_padded, num_reqs_padded, host.num_reqs, host.num_tokens,
                              host.max_query_len, host.max_seq_len)
        self.store_block_table(host.block_table)
        return meta

    def host_batch(self, rows: list[RowPlan], num_reqs_padded: int, input_ids: list[int] | None) -> HostBatch:
        values = {name: [] for name in TOKEN_FIELDS + ROW_FIELDS}
        values["input_ids"] = input_ids if input_ids is not None else [t for r in rows for t in r.token_ids]
        values["query_start_loc"] = [0]
        table = torch.zeros((num_reqs_padded, self.buffers["block_table"].shape[1]), dtype=torch.int64)
        for i, row in enumerate(rows):
            for p in range(row.first_position, row.seq_len):
                clamped = min(p, self.max_model_len - 1)
                values["positions"].append(clamped)
                values["slot_mapping"].append(self.slot_of(row.blocks, p))
                values["window_start"].append(self.window_start_of(clamped))
            values["query_start_loc"].append(values["query_start_loc"][-1] + row.query_len)
            values["seq_lens"].append(min(row.seq_len, self.max_model_len))
            values["req_ids"].append(row.req_id)
            table[i, : len(row.blocks)] = torch.tensor(row.blocks, dtype=torch.int64)
        return HostBatch(values, table, sum(r.query_len for r in rows), len(rows),
                         max(r.query_len for r in rows), max(r.seq_len for r in rows))

    def padding(self, num_tokens: int, num_tokens_padded: int, num_reqs: int, num_reqs_padded: int) -> tuple[int, int]:
        """How many padded token entries and padded row entries to write."""
        return num_tokens_padded - num_tokens, num_reqs_padded - num_reqs

    def write(self, name: str, values: list[int], pad: int, num_tokens: int) -> None:
        """Copy `values` and `pad` inert entries into the front of buffer `name`."""
        self._fill(name, values, pad, num_tokens)

    def _fill(self, name: str, values: list[int], pad: int, num_tokens: int) -> None:
        inert = self.buffers.spec(name).inert_value(num_tokens)
        host = torch.tensor(values + [inert] * pad, dtype=torch.int64)
        self.buffers[name][: len(host)].copy_(host, non_blocking=True)

    def store_block_table(self, table: torch.Tensor) -> None:
        """The batch's block table into the buffer the view already points at."""
        self.buffers["block_table"][: table.shape[0]].copy_(table)

    def make_view(self, num_tokens_padded: int, num_reqs_padded: int, num_reqs: int,
                  num_actual_tokens: int, max_query_len: int, max_seq_len: int) -> AttentionMetadata:
        b = self.buffers
        return self.metadata_class(
            query_start_loc=b["query_start_loc"][: num_reqs_padded + 1],
            seq_lens=b["seq_lens"][:num_reqs_padded],
            slot_mapping=b["slot_mapping"][:num_tokens_padded],
            block_table=b["block_table"][:num_reqs_padded],
            positions=b["positions"][:num_tokens_padded],
            window_start=b["window_start"][:num_tokens_padded],
            num_reqs=num_reqs,
            num_actual_tokens=num_actual_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            **tree_view(b, num_tokens_padded),
            kv_cache=self.kv_cache,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            window_layers=self.window_layers,
        )

    def build_dummy(self, num_tokens_padded: int, num_reqs_padded: int) -> AttentionMetadata:
        """Capture-time metadata: every token padding (PAD slots), so capture writes no KV."""
        for name in TOKEN_FIELDS + (TREE_FIELDS if "tree_bits" in self.buffers else ()):
            self._fill(name, [], num_tokens_padded, 0)
        for name in ROW_FIELDS:
            self._fill(name, [0] if name == "query_start_loc" else [], num_reqs_padded, num_tokens_padded)
        self.buffers["block_table"][:num_reqs_padded].zero_()
        return self.make_view(num_tokens_padded, num_reqs_padded, num_reqs_padded, num_tokens_padded, 1, 1)

    # --- between draft decode steps ---------------------------------------------------------

    def frontier_live(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """The tree frontier rows to advance between draft steps: the live ones (a padded row's seq_lens is 0)."""
        return seq_lens > 0

    def advance_draft_step(self, meta: AttentionMetadata, num_reqs_padded: int) -> None:
        """Move every live row one position on (one token per row), in place, on the device.

        positions += 1, seq_lens += 1, slot_mapping recomputed from the block table,
        positions past max_model_len clamped with a PAD slot, sliding-window starts
        rebuilt. Padded rows (seq_lens 0) stay inert. A tree's frontier: `tree_drafter.advance`.
        """
        if meta.tree_bits is not None:
            return tree_drafter.advance(self.buffers, meta, self.block_size, self.max_model_len, self.frontier_live)
        n = num_reqs_padded
        positions = meta.positions[:n]
        seq_lens = meta.seq_lens[:n]
        live = seq_lens > 0
        next_pos = positions + 1
        overflow = next_pos >= self.max_model_len
        positions.copy_(torch.where(live, next_pos.clamp(max=self.max_model_len - 1), 0))
        seq_lens.copy_(torch.where(live, (seq_lens + 1).clamp(max=self.max_model_len), 0))
        block_idx = (positions // self.block_size).unsqueeze(1)
        blocks = meta.block_table[:n].gather(1, block_idx).squeeze(1)
        slots = torch.where(live & ~overflow, blocks * self.block_size + positions % self.block_size, PAD_SLOT)
        self.store_slots(meta, slots, n)
        self.advance_window(meta, positions, n)

    def store_slots(self, meta: AttentionMetadata, slots: torch.Tensor, n: int) -> None:
        """The rows' new slots into the slot_mapping the view points at."""
        meta.slot_mapping[:n].copy_(slots)

    def advance_window(self, meta: AttentionMetadata, positions: torch.Tensor, n: int) -> None:
        """Rebuild the sliding-window starts for the new positions (position-dependent state)."""
        if self.sliding_window:
            meta.window_start[:n].copy_((positions - self.sliding_window + 1).clamp(min=0))
