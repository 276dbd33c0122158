"""The drafter's side of tree drafts: expanding the frontier inside the captured forwards, and between them.

The draft prefill samples no token: it writes the root's `topk` best children
as the first frontier (candidates 0..topk-1). Each draft step forwards the
frontier (topk nodes per request, one query token each), scores each node's
`topk` best children by cumulative log-probability, writes those topk * topk
candidates into the columns of its draft step, and keeps the topk best as the
next frontier: their tokens into input_ids, their parents' hidden states into
hidden_states, their visible nodes into `frontier_bits`. Everything is shaped
by Python ints and indexed by the `draft_step` buffer, so one captured step
replays for every step.

Between steps (eager, on the device, like `MetadataBuilder.advance_draft_step`):
the frontier moves one position deeper and topk sequence indices on; padded
rows (seq_lens 0) stay inert. On the host, after the last step, `tree.select_tree`
keeps the best candidates.
"""

from __future__ import annotations

import torch

from parity.engine.buffers import ROW, InputBuffers
from parity.engine.config import EngineConfig, candidate_columns, max_tree_nodes
from parity.engine.kv_cache import PAD_SLOT

# What every tree draft forward writes per row (the candidates and the frontier).
TREE_OUTPUTS = ("cand_tokens", "cand_scores", "cand_parents")
FRONTIER = ("frontier_ids", "frontier_scores", "frontier_bits")
ROOT = ("root_hidden",)


def register_drafter_buffers(b: InputBuffers, config: EngineConfig, hidden_size: int, dtype: torch.dtype) -> None:
    rows, k = config.max_num_seqs, config.topk
    m = candidate_columns(config.num_speculative_tokens, k)
    b.register("cand_tokens", (rows, m), torch.int64, ROW)
    b.register("cand_scores", (rows, m), torch.float32, ROW)
    b.register("cand_parents", (rows, m), torch.int64, ROW)
    b.register("frontier_ids", (rows, k), torch.int64, ROW)
    b.register("frontier_scores", (rows, k), torch.float32, ROW)
    b.register("frontier_bits", (rows, k), torch.int64, ROW)
    b.register("root_hidden", (rows, hidden_size), dtype, ROW)


def frontier_rows(num_tokens_padded: int, num_reqs_padded: int, k: int) -> int:
    """Rows whose frontier a draft step of this padded shape holds: a token-keyed graph may pad rows
    past its tokens / k (the real rows are within both)."""
    return min(num_reqs_padded, num_tokens_padded // k)


def emit_root(b: InputBuffers, k: int, n: int, logits: torch.Tensor, row_hidden: torch.Tensor) -> None:
    """After the draft prefill: the root's k best children are the first frontier (seq slots 0..k-1).

    The first step's inputs are written by `first_inputs`, eagerly, for the real
    rows only: written here, a padded row's k entries would sit among a real
    row's next inputs (the prefill's rows are not the step's tokens)."""
    top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    ids = torch.arange(k, device=logits.device)
    b["cand_tokens"][:n, :k].copy_(top.indices)
    b["cand_scores"][:n, :k].copy_(top.values)
    b["cand_parents"][:n, :k].fill_(-1)
    b["frontier_ids"][:n].copy_(ids.expand(n, k))
    b["frontier_scores"][:n].copy_(top.values)
    b["frontier_bits"][:n].copy_(torch.ones_like(ids).bitwise_left_shift(ids).expand(n, k))
    b["root_hidden"][:n].copy_(row_hidden)


def first_inputs(b: InputBuffers, k: int, n: int) -> None:
    """The first draft step's inputs for `n` real rows: the first frontier's tokens, the root's hidden state."""
    b["input_ids"][: n * k].copy_(b["cand_tokens"][:n, :k].flatten())
    b["hidden_states"][: n * k].copy_(b["root_hidden"][:n].repeat_interleave(k, dim=0))


def expand(b: InputBuffers, k: int, n: int, logits: torch.Tensor, node_hidden: torch.Tensor) -> None:
    """One draft step over the frontier ([n * k] nodes): the step's candidates and the next frontier."""
    dev = logits.device
    child = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)            # [n * k, k]
    tokens = child.indices.view(n, k * k)
    scores = (b["frontier_scores"][:n].unsqueeze(2) + child.values.view(n, k, k)).view(n, k * k)
    step = b["draft_step"].clamp(min=1)          # [1], the step j >= 1 (a capture runs with 0: step 1's columns)
    cols = (k + (step - 1) * k * k + torch.arange(k * k, device=dev)).expand(n, k * k)
    b["cand_tokens"][:n].scatter_(1, cols, tokens)
    b["cand_scores"][:n].scatter_(1, cols, scores)
    b["cand_parents"][:n].scatter_(1, cols, b["frontier_ids"][:n].repeat_interleave(k, dim=1))
    best = scores.topk(k, dim=1)
    parent = best.indices.div(k, rounding_mode="floor")                           # frontier slot of each
    own = step * k + torch.arange(k, device=dev)
    bits = b["frontier_bits"][:n].gather(1, parent).bitwise_or(torch.ones_like(own).bitwise_left_shift(own))
    b["frontier_bits"][:n].copy_(bits)
    b["frontier_ids"][:n].copy_(cols.gather(1, best.indices))
    b["frontier_scores"][:n].copy_(best.values)
    b["input_ids"][: n * k].copy_(tokens.gather(1, best.indices).flatten())
    hidden = node_hidden.view(n, k, node_hidden.shape[-1])
    b["hidden_states"][: n * k].copy_(hidden.gather(1, parent.unsqueeze(2).expand(n, k, hidden.shape[2]))
                                      .flatten(0, 1))


def advance(b: InputBuffers, meta, block_size: int, max_model_len: int, live_of=None) -> None:
    """Between tree draft steps: the next frontier's positions, sequence indices, slots and visible nodes.

    `live_of(seq_lens)`: the rows to advance (default: seq_lens > 0; a padded row stays inert)."""
    k = b["frontier_bits"].shape[1]
    n = frontier_rows(meta.positions.shape[0], meta.seq_lens.shape[0], k)
    t = n * k
    seq_lens = meta.seq_lens[:n]
    live_rows = seq_lens > 0 if live_of is None else live_of(seq_lens)
    live = live_rows.repeat_interleave(k)
    positions = meta.positions[:t]
    positions.copy_(torch.where(live, (positions + 1).clamp(max=max_model_len - 1), 0))
    seq = meta.tree_seq[:t]
    seq.copy_(torch.where(live, seq + k, 0))
    seq_lens.copy_(torch.where(live_rows, (seq_lens + k).clamp(max=max_model_len), 0))
    overflow = seq >= max_model_len
    index = seq.clamp(max=max_model_len - 1)
    table = meta.block_table[:n].repeat_interleave(k, dim=0)
    blocks = table.gather(1, (index // block_size).unsqueeze(1)).squeeze(1)
    meta.slot_mapping[:t].copy_(torch.where(live & ~overflow, blocks * block_size + index % block_size, PAD_SLOT))
    meta.tree_bits[:t].copy_(torch.where(live, b["frontier_bits"][:n].flatten(), 0))


def read_candidates(b: InputBuffers, n: int, steps: int, k: int) -> list[tuple[list, list, list]]:
    """Per row: every candidate's token, score and parent drafted this engine step."""
    m = max_tree_nodes(steps, k)
    tokens = b["cand_tokens"][:n, :m].tolist()
    scores = b["cand_scores"][:n, :m].tolist()
    parents = b["cand_parents"][:n, :m].tolist()
    return [(tokens[i], scores[i], parents[i]) for i in range(n)]
