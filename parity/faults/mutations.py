"""Mutations of engine parts: mixins over a metadata builder or the proposer, one step each.

Each is the one-line mistake of its report, written where that mistake lives;
`seam.py` names them and stacks them onto `EngineParts`.
"""

from __future__ import annotations

import dataclasses

import torch

from parity.engine.kv_cache import PAD_SLOT
from parity.engine.metadata import AttentionMetadata
from parity.faults.peek import SeesDraftMeta, SeesTargetMeta, kept


class ReassignSeqLens:
    """The builder rebinds seq_lens to a new tensor instead of copying into the buffer."""

    def write(self, name, values, pad, num_tokens):
        if name != "seq_lens":
            return super().write(name, values, pad, num_tokens)
        rebind(self.buffers, name, values + [self.buffers.spec(name).inert_value(num_tokens)] * pad)


class ReassignQueryStartLoc:
    """The drafter's query_start_loc is built into a fresh tensor every step."""

    def write(self, name, values, pad, num_tokens):
        if name != "query_start_loc":
            return super().write(name, values, pad, num_tokens)
        rebind(self.buffers, name, values + [self.buffers.spec(name).inert_value(num_tokens)] * pad)


def rebind(buffers, name: str, values: list[int]) -> None:
    fresh = torch.zeros_like(buffers[name])
    fresh[: len(values)] = torch.tensor(values, dtype=fresh.dtype)
    buffers.rebind(name, fresh)


class StaleSlotMapping:
    """Between draft steps the new slots reach the metadata object, not the captured buffer."""

    def store_slots(self, meta, slots, n):
        fresh = meta.slot_mapping.clone()
        fresh[:n] = slots
        meta.slot_mapping = fresh


class StaleBlockTable:
    """A request's block-table row is copied only when first seen, not after it grows."""

    def build(self, rows, *args, **kwargs):
        with kept(self, "batch", {"rows": rows}):
            meta = super().build(rows, *args, **kwargs)
            # Eager code reads the right table from the metadata object; a FULL graph reads the buffer.
            meta.block_table = self.batch["table"].to(self.buffers.device)
        return meta

    def store_block_table(self, table):
        written = self.__dict__.setdefault("_rows_written", {})
        for i, row in enumerate(self.batch["rows"]):
            if written.get(row.req_id) != i:
                self.buffers["block_table"][i].copy_(table[i])
                written[row.req_id] = i
        self.batch["table"] = table


# Host buffers a captured graph copies from (kept for as long as the process runs: a planted fault).
CAPTURED_HOST_VALUES: list = []


@dataclasses.dataclass
class HostWindowMetadata(AttentionMetadata):
    """Metadata carrying each token's sliding-window start as Python ints."""

    window_start_host: tuple = ()
    positions_host: tuple = ()
    window: int = 0

    def window_starts(self) -> torch.Tensor:
        starts = torch.zeros_like(self.window_start)
        host = torch.tensor(self.window_start_host, dtype=starts.dtype)
        if starts.is_cuda:
            # A copy from pageable memory cannot be captured; a pinned one can, and a graph then replays
            # it from this very buffer, which must outlive the graph.
            host = host.pin_memory()
            if torch.cuda.is_current_stream_capturing():
                CAPTURED_HOST_VALUES.append(host)
        starts[: len(host)].copy_(host, non_blocking=True)
        return starts


class FrozenWindowState:
    """The sliding-window starts (position-dependent builder state) are handed over as Python ints: right
    in eager code, which rebuilds the tensor every forward; baked into a graph at capture."""

    metadata_class = HostWindowMetadata

    def make_view(self, num_tokens_padded, num_reqs_padded, num_reqs, num_actual_tokens, max_query_len,
                  max_seq_len):
        meta = super().make_view(num_tokens_padded, num_reqs_padded, num_reqs, num_actual_tokens,
                                 max_query_len, max_seq_len)
        meta.window = self.sliding_window
        meta.positions_host = tuple(self.buffers["positions"][:num_actual_tokens].tolist())
        meta.window_start_host = tuple(self.buffers["window_start"][:num_actual_tokens].tolist())
        return meta

    def advance_window(self, meta, positions, n):
        super().advance_window(meta, positions, n)
        meta.positions_host = tuple(p + 1 for p in meta.positions_host)
        meta.window_start_host = tuple(max(0, p - meta.window + 1) for p in meta.positions_host)


class PaddedRowsUnmasked:
    """num_tokens / num_reqs used where the padded sizes are needed: padding keeps stale entries."""

    def padding(self, num_tokens, num_tokens_padded, num_reqs, num_reqs_padded):
        return 0, 0


class FrozenDraftStep(SeesDraftMeta):
    """The draft step index reaches the captured step as a Python int."""

    def draft_column(self, n):
        return torch.full((n, 1), self.forward_meta.draft_step, dtype=torch.int64, device=self.buffers.device)


class HiddenStatesNotCopied:
    """The draft hidden-state update is moved out of the captured step into eager code.

    It copies whatever tensor the step function last produced in Python: at
    replay, the tensor of the last capture.
    """

    def store_hidden(self, row_hidden, n):
        self._last_hidden = row_hidden

    def prepare_steps(self, rows):
        self._copy_last_hidden(len(rows))
        return super().prepare_steps(rows)

    def advance(self, meta, dispatch):
        self._copy_last_hidden(dispatch.num_reqs)
        super().advance(meta, dispatch)

    def _copy_last_hidden(self, n):
        self.buffers["hidden_states"][:n].copy_(self._last_hidden[:n])


class SeqLensReallocated:
    """The builder hands out seq_lens as `.to(torch.int32)`, the attention kernel's dtype: a new tensor every
    build, so a graph reads the one it was captured with forever (vLLM #51994)."""

    def make_view(self, *args):
        meta = super().make_view(*args)
        meta.seq_lens = meta.seq_lens.to(torch.int32)
        return meta


class InputIdsRebound:
    """Token ids arrive as int32 and are stored by rebinding the buffer, not copy_ into it (vLLM #17211)."""

    def write(self, name, values, pad, num_tokens):
        if name != "input_ids":
            return super().write(name, values, pad, num_tokens)
        inert = self.buffers.spec(name).inert_value(num_tokens)
        self.buffers.rebind(name, torch.tensor(values + [inert] * pad, dtype=torch.int32,
                                               device=self.buffers.device))


class SamplerOffsetByHostStep(SeesDraftMeta):
    """The draft sampler's random stream is offset by the host draft step (Megatron-LM #5697).

    A graph bakes the offset at capture: every replay draws the same random numbers.
    """

    def sampling_positions(self, drafted_positions):
        return drafted_positions + 7919 * self.forward_meta.draft_step


class LogitsReadNextStep:
    """A step's records are completed while the next step runs (overlap scheduling, SGLang #15399), from the
    target's logits held by reference: copying them out first is the step that was dropped.

    Eager logits are a fresh tensor per forward and survive; a graph's are its static output, which the next
    verify replay overwrites before they are read.
    """

    def read_logits(self, entries, logits):
        pending, self._pending = getattr(self, "_pending", None), (entries, logits)
        if pending is not None:
            super().read_logits(*pending)

    def frames(self):
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is not None:
            super().read_logits(*pending)
        return super().frames()


class QueryStartLocOneShort:
    """The drafter allocates query_start_loc with max_num_seqs entries, one short of max_num_seqs + 1: enough
    for every real batch of fewer rows, and one short for a batch padded to max_num_seqs rows, whose slice
    comes back silently short (vLLM #50065: buffers sized for the largest real batch, not the padded one)."""

    def __init__(self, head, config, *args, **kwargs):
        super().__init__(head, config, *args, **kwargs)
        self.buffers.rebind("query_start_loc", torch.zeros(config.max_num_seqs, dtype=torch.int64,
                                                           device=self.buffers.device))


class SeqLensFromTail:
    """For a padded batch the seq_lens view starts at the padded row count (the second half of a double-buffered
    layout that was never built): live rows take their bounds from the buffer's tail, which a larger batch left."""

    def make_view(self, num_tokens_padded, num_reqs_padded, num_reqs, *args):
        meta = super().make_view(num_tokens_padded, num_reqs_padded, num_reqs, *args)
        seq_lens = self.buffers["seq_lens"]
        if num_reqs_padded > num_reqs and 2 * num_reqs_padded <= seq_lens.shape[0]:
            meta.seq_lens = seq_lens[num_reqs_padded: 2 * num_reqs_padded]
        return meta


class PaddedSlotsReused:
    """Padded tokens' slot_mapping entries keep slots of an earlier batch instead of PAD: once that batch's
    request finished and its blocks went to another, padded tokens write KV a live request owns.

    (The stale slots are ones this forward's live tokens do not write: a padded token and a live one writing
    the same slot in one forward race on CUDA, which would make the bug's first sign depend on the backend.)"""

    def write(self, name, values, pad, num_tokens):
        if name != "slot_mapping":
            return super().write(name, values, pad, num_tokens)
        live = set(values)
        earlier = [slot for slot in getattr(self, "_earlier_slots", []) if slot not in live and slot >= 0]
        filler = [earlier[i % len(earlier)] for i in range(pad)] if earlier else [PAD_SLOT] * pad
        self.buffers[name][: len(values) + pad].copy_(torch.tensor(values + filler, dtype=torch.int64))
        self._earlier_slots = (list(values) + earlier)[:4096]


class DraftBoundBatchMin:
    """Draft decode steps (one token per row) bound every row's context by the batch's shortest, reduced in
    place inside the step over all rows of the padded batch: a padded row's zero seq_len becomes every live
    row's bound (a reduction that should have stopped at the live rows)."""

    def step_forward(self, num_tokens_padded, num_reqs_padded, meta):
        seq_lens = meta.seq_lens[:num_reqs_padded]
        seq_lens.copy_(torch.minimum(seq_lens, seq_lens.min()))
        return super().step_forward(num_tokens_padded, num_reqs_padded, meta)


class LogitsOfLiveTokens(SeesTargetMeta):
    """The target computes logits for the live tokens only, counting them on the host with `.item()` on
    query_start_loc: right in eager code, and a host sync inside the captured verify forward, which no graph
    can capture."""

    def logits(self, hidden):
        live = int(self.forward_meta.query_start_loc[-1].item())
        return super().logits(hidden[:live])


class SamplerOffsetAdvancedInForward:
    """The draft sampler's random stream is offset by a counter the forward advances itself
    (`self.rng_offset += 1` after each draw, a Philox offset kept on the host): eager code draws fresh numbers
    every forward; a graph replays the offset its capture read, and its replays never move the counter."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng_offset = 0

    def sampling_positions(self, drafted_positions):
        offset = self.rng_offset
        self.rng_offset += 1
        return drafted_positions + 7919 * offset


class MtpLayerIndexFrozen(SeesDraftMeta):
    """The MTP layer index reaches the forward as the host draft step (vLLM #48892): a graph captured with step 0
    replays layer 0 at every draft step."""

    def step_index(self):
        return torch.full((1,), self.forward_meta.draft_step, dtype=torch.int64, device=self.buffers.device)


class MtpPaddedRowsNotSkipped:
    """The drafter's sampler does not skip padded rows (TensorRT-LLM #5058): their samples go to the pad slot, 0,
    so the last padded row's token and hidden state overwrite row 0's inputs of the next draft step."""

    def store_hidden(self, row_hidden, n):
        super().store_hidden(row_hidden, n)
        b = self.buffers
        padded = b["seq_lens"][n - 1] == 0        # padding rows come last, with the pad seq_len 0
        b["hidden_states"][0].copy_(torch.where(padded, row_hidden[n - 1], row_hidden[0]))
        b["input_ids"][:1].copy_(torch.where(padded, b["input_ids"][n - 1:n], b["input_ids"][:1]))
