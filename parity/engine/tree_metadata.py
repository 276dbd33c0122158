"""The attention metadata of tree drafts (topk > 1): where each node's key sits and which nodes it sees.

A tree forward lays a request's nodes out one per query token, in an order
where every parent comes before its children. Node i's key goes to sequence
index `first_position + i` (its KV slot, and the causal bound of its query),
while its rotary position is the request's position plus the node's depth.
Past the tree's `base` (the sequence index of its first node) a node sees
only the nodes whose bit is set in its `bits` (its ancestors and itself);
before it, the request's whole context.

Three persistent per-token buffers hold this, registered only when the engine
drafts trees (so a chain engine is bitwise what it was): `tree_seq`,
`tree_base` (FREE, like positions: a padded token has no slot and no output)
and `tree_bits`, INERT with pad 0: padding sees no node. The builder writes
them with the other token fields and the view carries them
(`AttentionMetadata.tree_seq`, `tree_base`, `tree_bits`), so every graph mode
and padded reference reads them from the same addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parity.engine.buffers import FREE, INERT, TOKEN, InputBuffers

TREE_FIELDS = ("tree_seq", "tree_base", "tree_bits")
MAX_TREE_KEYS = 63     # a node's bits are one int64


@dataclass(frozen=True)
class RowTree:
    """One request's tree share of a forward: per query token, its rotary position and visible nodes."""

    positions: tuple[int, ...]   # rotary position of each query token
    base: int                    # sequence index of the tree's first node
    bits: tuple[int, ...]        # per query token: bit i set = sees the key at base + i


def register_tree_buffers(buffers: InputBuffers, max_tokens: int, max_model_len: int) -> None:
    i64 = torch.int64
    buffers.register("tree_seq", (max_tokens,), i64, TOKEN, 0, FREE)
    buffers.register("tree_base", (max_tokens,), i64, TOKEN, max_model_len, FREE)
    buffers.register("tree_bits", (max_tokens,), i64, TOKEN, 0, INERT)


def tree_view(buffers: InputBuffers, num_tokens_padded: int) -> dict[str, torch.Tensor]:
    """The metadata fields of the tree buffers ([num_tokens_padded] each), none without them."""
    if "tree_bits" not in buffers:
        return {}
    return {name: buffers[name][:num_tokens_padded] for name in TREE_FIELDS}


def tree_values(rows, max_model_len: int) -> dict[str, list[int]]:
    """The tree fields of a batch's real tokens; a row without a tree sees its context causally."""
    values = {name: [] for name in TREE_FIELDS + ("positions",)}
    for row in rows:
        seq = list(range(row.first_position, row.seq_len))
        tree = row.tree
        if tree is None:
            values["positions"] += [min(p, max_model_len - 1) for p in seq]
            values["tree_base"] += [max_model_len] * len(seq)
            values["tree_bits"] += [0] * len(seq)
        else:
            assert len(tree.positions) == len(seq) == len(tree.bits), "one tree entry per query token"
            values["positions"] += list(tree.positions)
            values["tree_base"] += [tree.base] * len(seq)
            values["tree_bits"] += list(tree.bits)
        values["tree_seq"] += seq
    return values


def ancestor_bits(parents: list[int]) -> list[int]:
    """Per node (parents[i] < i, -1 for a child of the root): the bits of itself and its ancestors."""
    bits: list[int] = []
    for i, parent in enumerate(parents):
        assert -1 <= parent < i < MAX_TREE_KEYS, "a parent comes before its child"
        bits.append((1 << i) | (bits[parent] if parent >= 0 else 0))
    return bits
