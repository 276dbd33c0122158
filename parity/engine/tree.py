"""Tree drafts on the host: which candidates a request's tree keeps, and which path the target accepts.

The drafter expands `topk` candidates per step (docs/tree.md): `topk` children of
the root at the first step, then `topk` children of each of the `topk` frontier
nodes at each later step, every candidate scored by its cumulative draft
log-probability and pointing at its parent (a candidate id, -1 for the root).
The tree keeps the `num_draft_tokens` best-scored candidates, SGLang's rule.

A node's score is its parent's plus a log-probability <= 0, so it never beats its
parent; ranking by score with ties kept in candidate order (parents are drafted
before their children) puts every kept node after its parent, and keeps a node's
parent whenever it keeps the node. That order is the tree's node order: node i's
parent is an earlier node or the root.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    """One request's kept nodes, parents first."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]      # node index of each node's parent, -1 for a child of the root
    scores: tuple[float, ...]     # cumulative draft log-probabilities

    def depth(self, node: int) -> int:
        d = 0
        while node >= 0:
            node, d = self.parents[node], d + 1
        return d

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is `node` (-1: the root), best-scored first."""
        return [i for i, p in enumerate(self.parents) if p == node]


def select_tree(tokens: list[int], scores: list[float], parents: list[int], num_nodes: int) -> DraftTree:
    """The `num_nodes` best candidates (ties in candidate order), as a tree whose parents come first."""
    order = sorted(range(len(tokens)), key=lambda c: -scores[c])[:num_nodes]     # sorted() is stable
    node_of = {c: i for i, c in enumerate(order)}
    kept_parents = []
    for c in order:
        parent = parents[c]
        assert parent < 0 or parent in node_of, "a kept candidate's parent is kept before it"
        kept_parents.append(-1 if parent < 0 else node_of[parent])
    return DraftTree(tuple(tokens[c] for c in order), tuple(kept_parents), tuple(scores[c] for c in order))


def accept_greedy(tree: DraftTree, argmax: list[int]) -> list[int]:
    """The longest root-to-leaf path the target accepts: its nodes, root's child first.

    `argmax[0]` is the target's token after the root, `argmax[1 + i]` after node i.
    A node is accepted when its parent is (the root always is) and it equals the
    target's token at its parent. A node's children hold distinct tokens, so at
    most one child of an accepted node is accepted: the accepted nodes are one path.
    """
    path: list[int] = []
    node = -1
    while True:
        want = argmax[0] if node < 0 else argmax[1 + node]
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def best_path(tree: DraftTree, accepted: list[int]) -> list[int]:
    """The accepted path, then the best-scored child at each depth below it: the drafts a depth reports."""
    path = list(accepted)
    node = path[-1] if path else -1
    while True:
        children = tree.children(node)
        if not children:
            return path
        node = children[0]
        path.append(node)
