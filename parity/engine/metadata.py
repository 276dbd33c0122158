"""Per-forward attention metadata: a view over persistent buffers, and its builder.

The builder never allocates a tensor a forward reads: it copy_()s host-built
values into slices of the registered buffers and hands out a view of them.
Padding is explicit and inert: PAD slot -1 (writes skipped), positions 0,
seq_lens 0, query_start_loc clamped to num_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.buffers import InputBuffers
from parity.engine.kv_cache import PAD_SLOT, PagedKVCache


@dataclass
class RowPlan:
    """One request's share of a forward, built on the host."""

    req_id: int
    token_ids: list[int]       # the query tokens
    first_position: int        # position of token_ids[0]
    blocks: list[int]          # the request's KV blocks

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
    # Python values a builder may hand the forward (a FULL graph bakes them at capture)
    draft_step: int = 0
    window_start_host: int | None = None

    def window_for_layer(self, layer: int) -> bool | None:
        return True if layer in self.window_layers else None


class MetadataBuilder:
    """Writes a batch's metadata into one owner's buffers and returns the view."""

    def __init__(self, buffers: InputBuffers, kv_cache: PagedKVCache, block_size: int,
                 max_model_len: int, sliding_window: int = 0, window_layers: tuple[int, ...] = (),
                 faults: frozenset = frozenset(), drafter: bool = False):
        self.faults = faults
        self.drafter = drafter
        self._table_rows_written: dict[int, int] = {}
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

    def build(self, rows: list[RowPlan], num_tokens_padded: int, num_reqs_padded: int,
              input_ids: list[int] | None = None, write_input_ids: bool = True) -> AttentionMetadata:
        """Copy `rows` into the buffers, padded to the given sizes, and return the view.

        `input_ids` overrides the rows' token ids (the drafter's shifted inputs);
        `write_input_ids=False` leaves input_ids to the device (draft decode steps).
        """
        num_tokens = sum(r.query_len for r in rows)
        num_reqs = len(rows)
        assert num_tokens <= num_tokens_padded and num_reqs <= num_reqs_padded
        ids = input_ids if input_ids is not None else [t for r in rows for t in r.token_ids]
        positions, slots, windows = [], [], []
        qsl, seq_lens, req_ids = [0], [], []
        width = self.buffers["block_table"].shape[1]
        table = torch.zeros((num_reqs_padded, width), dtype=torch.int64)
        for i, row in enumerate(rows):
            for p in range(row.first_position, row.seq_len):
                clamped = min(p, self.max_model_len - 1)
                positions.append(clamped)
                slots.append(self.slot_of(row.blocks, p))
                windows.append(self.window_start_of(clamped))
            qsl.append(qsl[-1] + row.query_len)
            seq_lens.append(min(row.seq_len, self.max_model_len))
            req_ids.append(row.req_id)
            table[i, : len(row.blocks)] = torch.tensor(row.blocks, dtype=torch.int64)
        pad_t = num_tokens_padded - num_tokens
        pad_r = num_reqs_padded - num_reqs
        faults = self.faults
        if "padded-rows-unmasked" in faults:
            # FAULT: num_tokens / num_reqs used where the padded sizes are needed:
            # padded entries keep whatever an earlier batch left there.
            pad_t = pad_r = 0
        if write_input_ids:
            self._fill("input_ids", ids + [0] * pad_t)
        self._fill("positions", positions + [0] * pad_t)
        self._fill("slot_mapping", slots + [PAD_SLOT] * pad_t)
        self._fill("window_start", windows + [0] * pad_t)
        qsl_values = qsl + [num_tokens] * pad_r
        if "reassign-query-start-loc" in faults and self.drafter:
            # FAULT: the drafter's query_start_loc built into a fresh tensor each step.
            self._rebind("query_start_loc", qsl_values)
        else:
            self._fill("query_start_loc", qsl_values)
        if "reassign-seq-lens" in faults:
            # FAULT: seq_lens rebound to a new tensor instead of copied into the buffer.
            self._rebind("seq_lens", seq_lens + [0] * pad_r)
        else:
            self._fill("seq_lens", seq_lens + [0] * pad_r)
        self._fill("req_ids", req_ids + [0] * pad_r)
        meta = self.view(num_tokens_padded, num_reqs_padded, num_reqs, num_tokens,
                         max(r.query_len for r in rows), max(r.seq_len for r in rows))
        if "stale-block-table" in faults:
            # FAULT: a request's row of the block table is copied only when the request
            # is first seen, so blocks allocated later never reach the buffer.
            for i, row in enumerate(rows):
                if self._table_rows_written.get(row.req_id) != i:
                    self.buffers["block_table"][i].copy_(table[i])
                    self._table_rows_written[row.req_id] = i
            meta.block_table = table.to(self.buffers.device)
        else:
            self.buffers["block_table"][:num_reqs_padded].copy_(table)
        if "frozen-window-state" in faults:
            # FAULT: the window start cached as one Python int per batch.
            meta.window_start_host = min(windows) if windows else 0
        return meta

    def _rebind(self, name: str, values: list[int]) -> None:
        fresh = torch.zeros_like(self.buffers[name])
        fresh[: len(values)] = torch.tensor(values, dtype=fresh.dtype)
        self.buffers.rebind(name, fresh)

    def build_dummy(self, num_tokens_padded: int, num_reqs_padded: int) -> AttentionMetadata:
        """Capture-time metadata: every token padding (PAD slots), so capture writes no KV."""
        self._fill("input_ids", [0] * num_tokens_padded)
        self._fill("positions", [0] * num_tokens_padded)
        self._fill("slot_mapping", [PAD_SLOT] * num_tokens_padded)
        self._fill("window_start", [0] * num_tokens_padded)
        self._fill("query_start_loc", [0] + [num_tokens_padded] * num_reqs_padded)
        self._fill("seq_lens", [0] * num_reqs_padded)
        self._fill("req_ids", [0] * num_reqs_padded)
        self.buffers["block_table"][:num_reqs_padded].zero_()
        meta = self.view(num_tokens_padded, num_reqs_padded, num_reqs_padded, num_tokens_padded, 1, 1)
        if "frozen-window-state" in self.faults:
            meta.window_start_host = 0
        return meta

    def _fill(self, name: str, values: list[int]) -> None:
        host = torch.tensor(values, dtype=torch.int64)
        self.buffers[name][: len(values)].copy_(host, non_blocking=True)

    def view(self, num_tokens_padded: int, num_reqs_padded: int, num_reqs: int,
             num_actual_tokens: int, max_query_len: int, max_seq_len: int) -> AttentionMetadata:
        b = self.buffers
        return AttentionMetadata(
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
            kv_cache=self.kv_cache,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            window_layers=self.window_layers,
        )

    def advance_draft_step(self, meta: AttentionMetadata, num_reqs_padded: int) -> None:
        """Between draft decode steps (one token per row): move every live row one position on.

        positions += 1, seq_lens += 1, slot_mapping recomputed from the block table,
        positions past max_model_len clamped with a PAD slot, sliding-window starts
        rebuilt. Padded rows (seq_lens 0) stay inert. All in place, on the device.
        """
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
        if "stale-slot-mapping" in self.faults:
            # FAULT: the new slots go to the metadata object only; the persistent
            # buffer a graph captured keeps the previous step's slots.
            fresh = meta.slot_mapping.clone()
            fresh[:n] = slots
            meta.slot_mapping = fresh
        else:
            meta.slot_mapping[:n].copy_(slots)
        if self.sliding_window:
            meta.window_start[:n].copy_((positions - self.sliding_window + 1).clamp(min=0))
        if meta.window_start_host is not None:
            meta.window_start_host += 1
