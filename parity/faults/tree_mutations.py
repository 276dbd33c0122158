"""Faults of tree drafts (docs/tree.md): mixins over one step of the engine, as in `mutations.py`."""

from __future__ import annotations

import torch

from parity.engine.tree_metadata import TREE_FIELDS
from parity.faults.mutations import rebind


class TreeMaskRebuilt:
    """The builder writes each batch's tree mask (`tree_bits`) into a fresh tensor instead of copying into the
    buffer: eager and piecewise attention read the fresh one through the view, a FULL graph keeps the mask it
    was captured with (all padding: every node sees no other node)."""

    def write(self, name, values, pad, num_tokens):
        if name != "tree_bits":
            return super().write(name, values, pad, num_tokens)
        rebind(self.buffers, name, values + [self.buffers.spec(name).inert_value(num_tokens)] * pad)


class TreePaddingAttendsLive:
    """Between tree draft steps the frontier advances every row alike, padded ones included (SGLang #18647: the
    graph's padding slots keep stale draft state instead of being zeroed): a padded row gains k keys of context
    and slots from its block-table row, which a padded row does not own. Whatever a larger batch (or anything)
    left there, its nodes attend to those keys and write theirs into them: into a live request's KV when the row
    names that request's blocks. Eager never pads, so only graphs and their padded references run it."""

    def frontier_live(self, seq_lens):
        return torch.ones_like(seq_lens, dtype=torch.bool)


class TreeBuffersWithoutTopk:
    """The drafter sizes its tree metadata (`tree_seq`, `tree_base`, `tree_bits`) like the target's, for
    max_num_batched_tokens, without the draft step's topk factor (SGLang #27460 / #27338: the draft graph's
    kv_indices sized max_bs * max_context_len, not max_bs * topk * max_context_len). Every real batch of fewer
    rows fits; a graph captured for max_num_seqs rows of topk nodes slices past the end."""

    def __init__(self, head, config, *args, **kwargs):
        super().__init__(head, config, *args, **kwargs)
        if config.tree:
            for name in TREE_FIELDS:
                old = self.buffers[name]
                self.buffers.rebind(name, old.new_zeros(min(old.shape[0], config.max_num_batched_tokens)))
