"""The target's side of tree drafts: one verify forward over every node, the path it accepts, what is kept.

A decoding request's verify query is its last token (the root) then its tree's
nodes, parents first (`tree.DraftTree`); node i's key goes to the sequence index
after the root's plus i, its rotary position is the root's plus its depth
(`tree_metadata`). After the forward, on the host: the longest accepted path
(`tree.accept_greedy`; sampled, `tree_sampling.accept_sampled`), the tokens it emits (its nodes, then the target's token
after its last node), the KV of its nodes moved to the positions they now hold
(node at depth d to the root's index + d; the rest of the tree is left to be
overwritten, as a chain's rejected drafts are), and the verify rows of the
path put first, so the draft prefill reads them as it reads a chain's.
"""

from __future__ import annotations

import torch

from parity.engine import sampling
from parity.engine.metadata import RowPlan
from parity.engine.records import StepEntries
from parity.engine.tree import DraftTree, accept_greedy, best_path
from parity.engine.tree_metadata import RowTree, ancestor_bits
from parity.engine.tree_sampling import accept_sampled


def verify_tree(tree: DraftTree, first_position: int) -> RowTree:
    positions = (first_position,) + tuple(first_position + tree.depth(i) for i in range(len(tree.tokens)))
    return RowTree(positions, first_position + 1, (0,) + tuple(ancestor_bits(list(tree.parents))))


def emit(rows, plans, starts, logits: torch.Tensor, config) -> tuple[list, list[list[int]]]:
    """Per row: (emitted tokens, accepted drafts) and the accepted path (tree rows; [] for the others)."""
    out = sampling.emit(rows, plans, starts, logits, config, 0)
    paths: list[list[int]] = [[] for _ in rows]
    for i, row in enumerate(rows):
        if row.is_prefill:
            continue
        tree = row.request.draft_tree
        if config.temperature > 0:
            path, last = accept_sampled(tree, logits[starts[i]:starts[i + 1]], config.temperature, config.seed,
                                        plans[i].req_id, len(row.request.tokens))
        else:
            argmax = logits[starts[i]:starts[i + 1]].argmax(-1).tolist()
            path = accept_greedy(tree, argmax)
            last = argmax[1 + path[-1] if path else 0]
        out[i] = ([tree.tokens[p] for p in path] + [last], len(path))
        paths[i] = path
    return out, paths


def keep_path_kv(kv_cache, plans, paths, slot_of) -> None:
    """The accepted nodes' keys and values moved to the positions their tokens now hold (every layer)."""
    src, dst = [], []
    for plan, path in zip(plans, paths):
        for depth, node in enumerate(path, 1):
            if node + 1 != depth:   # a node sits at root + 1 + node; its token now at root + depth
                src.append(slot_of(plan.blocks, plan.first_position + 1 + node))
                dst.append(slot_of(plan.blocks, plan.first_position + depth))
    if not src:
        return
    # Every source is read before any destination is written (a destination may be another move's source).
    for cache in kv_cache.tensors():
        rows = torch.tensor(src, device=cache.device)
        cache.index_copy_(0, torch.tensor(dst, device=cache.device), cache.index_select(0, rows))


def path_first(features: torch.Tensor, starts: list[int], paths) -> torch.Tensor:
    """The verify features with each tree row's accepted path right after its root (the draft prefill's order)."""
    order = list(range(features.shape[0]))
    for i, path in enumerate(paths):
        if path:
            rows = [starts[i]] + [starts[i] + 1 + p for p in path]
            rest = [r for r in range(starts[i], starts[i + 1]) if r not in rows]
            order[starts[i]:starts[i + 1]] = rows + rest
    return features.index_select(0, torch.tensor(order, device=features.device))


def chain_plans(plans: list[RowPlan]) -> list[RowPlan]:
    """The draft prefill's layout: the verified tokens in a row, no tree."""
    return [RowPlan(p.req_id, p.token_ids, p.first_position, p.blocks) for p in plans]


def step_entries(step: int, rows, starts, emitted, trees, paths) -> StepEntries:
    """A tree step's records: emitted tokens, read where the target predicted them, and one draft per depth.

    Depth d's draft is the accepted node there, or below the accepted path the
    best-scored child (`tree.best_path`); it reads the target at its parent's row.
    """
    entries = StepEntries()
    for i, row in enumerate(rows):
        req = row.request
        tokens, accepted = emitted[i]
        base = len(req.tokens) - len(tokens)
        first_index = base - len(req.prompt)
        tokens = tokens[: max(0, req.max_tokens - first_index)]
        if row.is_prefill:
            reads = [starts[i + 1] - 1]
        else:
            reads = [starts[i]] + [starts[i] + 1 + p for p in paths[i]]
        for j, tok in enumerate(tokens):
            entries.tokens.append((reads[j], {"req_id": req.req_id, "step": step, "output_index": first_index + j,
                                              "position": base + j, "token": tok}))
        if row.is_prefill:
            continue
        tree = trees[i]
        for d, node in enumerate(best_path(tree, paths[i])):
            parent = tree.parents[node]
            entries.drafts.append((starts[i] + 1 + parent if parent >= 0 else starts[i], {
                "step": step, "req_id": req.req_id, "draft_index": d, "position": base + d,
                "draft_token": tree.tokens[node], "draft_logprob": tree.scores[node] - _score(tree, parent),
                "draft_top2_gap": float("nan"), "accepted": d < accepted, "num_accepted": accepted}))
    return entries


def _score(tree: DraftTree, node: int) -> float:
    return tree.scores[node] if node >= 0 else 0.0
