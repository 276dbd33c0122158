"""Tree drafts (topk > 1) on the host: the kept tree and the accepted path against brute force; the settings.

`select_tree` must keep exactly the num_draft_tokens best-scored candidates with
every parent before its child; `accept_greedy` must return the longest
root-to-node path whose every node equals the target's token at its parent,
found here by walking every path of the tree.
"""

from __future__ import annotations

import random

import pytest

from parity.engine.config import EngineSettings, SettingError
from parity.engine.tree import DraftTree, accept_greedy, best_path, select_tree


def random_candidates(rnd: random.Random, steps: int, k: int, vocab: int = 6):
    """Candidates as the drafter writes them: k children of the root, then k children of each of k frontier
    nodes per step (the frontier: the step's k best), scores cumulative log-probabilities."""
    tokens, scores, parents = [], [], []

    def children(parent: int, base: float) -> list[int]:
        picked = rnd.sample(range(vocab), k)
        lps = sorted((-rnd.choice([0.0, 0.25, 0.5, 1.0, 2.0]) for _ in range(k)), reverse=True)
        ids = []
        for tok, lp in zip(picked, lps):
            ids.append(len(tokens))
            tokens.append(tok)
            scores.append(base + lp)
            parents.append(parent)
        return ids

    frontier = children(-1, 0.0)
    for _ in range(steps - 1):
        step = [c for f in frontier for c in children(f, scores[f])]
        frontier = sorted(step, key=lambda c: -scores[c])[:k]
    return tokens, scores, parents


@pytest.mark.parametrize("seed", range(40))
def test_select_tree_keeps_the_best_scored_candidates_parents_first(seed):
    rnd = random.Random(seed)
    steps, k = rnd.randint(1, 4), rnd.randint(2, 4)
    tokens, scores, parents = random_candidates(rnd, steps, k)
    n = rnd.randint(1, len(tokens))
    tree = select_tree(tokens, scores, parents, n)
    assert len(tree.tokens) == n
    # The n best scores (ties may pick either candidate, the multiset of scores is fixed).
    assert sorted(tree.scores, reverse=True) == sorted(scores, reverse=True)[:n]
    for i, p in enumerate(tree.parents):
        assert -1 <= p < i, "a node's parent is the root or an earlier node"
        if p >= 0:
            assert tree.scores[p] >= tree.scores[i]
    # Each kept node is a candidate whose parent chain is the kept nodes' chain.
    kept = {}
    for i, (tok, sc) in enumerate(zip(tree.tokens, tree.scores)):
        matches = [c for c in range(len(tokens)) if tokens[c] == tok and scores[c] == sc and c not in kept.values()
                   and (parents[c] == -1 if tree.parents[i] < 0 else parents[c] == kept[tree.parents[i]])]
        assert matches, f"node {i} is no candidate under its parent"
        kept[i] = matches[0]


def all_paths(tree: DraftTree) -> list[list[int]]:
    paths = [[]]
    for i in range(len(tree.tokens)):
        chain, node = [], i
        while node >= 0:
            chain.insert(0, node)
            node = tree.parents[node]
        paths.append(chain)
    return paths


def brute_accept(tree: DraftTree, argmax: list[int]) -> list[int]:
    def accepted(path):
        prev = -1
        for node in path:
            if tree.tokens[node] != (argmax[0] if prev < 0 else argmax[1 + prev]):
                return False
            prev = node
        return True
    return max((p for p in all_paths(tree) if accepted(p)), key=len)


@pytest.mark.parametrize("seed", range(60))
def test_accept_greedy_is_the_longest_accepted_path(seed):
    rnd = random.Random(seed)
    tokens, scores, parents = random_candidates(rnd, rnd.randint(1, 4), rnd.randint(2, 3), vocab=4)
    tree = select_tree(tokens, scores, parents, rnd.randint(1, len(tokens)))
    # The target's tokens: mostly the drafted ones (so long paths happen), sometimes not.
    argmax = [rnd.randrange(4) for _ in range(len(tree.tokens) + 1)]
    for i in range(len(argmax)):
        kids = tree.children(i - 1)
        if kids and rnd.random() < 0.8:
            argmax[i] = tree.tokens[rnd.choice(kids)]
    path = accept_greedy(tree, argmax)
    assert path == brute_accept(tree, argmax)
    below = best_path(tree, path)
    assert below[: len(path)] == path and all(tree.parents[b] == a for a, b in zip(below, below[1:]))


@pytest.mark.parametrize("settings, key", [
    (dict(topk=4), "topk"),
    (dict(topk=1, num_draft_tokens=2), "num_draft_tokens"),
    (dict(topk=9), "topk"),
    (dict(topk=2, num_draft_tokens=7, num_speculative_tokens=2), "num_draft_tokens"),
    (dict(topk=8, num_draft_tokens=8, num_speculative_tokens=8), "topk"),
])
def test_tree_settings_refused_with_one_line(settings, key):
    with pytest.raises(SettingError) as error:
        EngineSettings(**settings)
    assert error.value.key == key and "\n" not in str(error.value)


def test_chain_settings_are_the_chain():
    chain = EngineSettings(num_speculative_tokens=4)
    assert not chain.tree and chain.tree_width == 4 and EngineSettings(num_speculative_tokens=4, num_draft_tokens=4)
    tree = EngineSettings(num_speculative_tokens=5, topk=4, num_draft_tokens=15, max_num_batched_tokens=256)
    assert tree.tree and tree.tree_width == 15


def test_tree_expansion_follows_the_chain_drafter_where_their_paths_meet(random_pair, monkeypatch):
    """The drafter's tree attention against the chain drafter as brute force.

    Both engines draft from the same contexts at step 0 (every request prefilled
    then). The tree's best depth-1 candidate is the chain's draft 0; below it the
    best child of the chain's node, wherever that node reached the frontier, must
    be the chain's next draft, with its log-probability: a node that saw a sibling
    or missed an ancestor in the drafter's cache drafts from another context. The
    two engines forward different batch shapes (topk nodes per request against
    one), so the log-probabilities agree to fp32 rounding, not bitwise: 1e-4
    absolute, below what a wrong context moves (a frontier that forgot its
    ancestors moved one by 4.6e-3 with this pair).
    """
    from tests.conftest import engine_config, make_specs
    from parity.engine import tree_drafter
    from parity.engine.spec_decode import SpecDecodeEngine

    specs = make_specs(3, seed=5, max_tokens=6, min_prompt=4, max_prompt=20, stagger=0)
    base = dict(num_speculative_tokens=4, max_num_seqs=3, max_num_batched_tokens=96)
    chain = SpecDecodeEngine(*random_pair, engine_config(**base)).run(specs).drafts
    seen = []
    read = tree_drafter.read_candidates
    monkeypatch.setattr(tree_drafter, "read_candidates", lambda *a: seen.append(read(*a)) or seen[-1])
    k = 3
    SpecDecodeEngine(*random_pair, engine_config(**base, topk=k, num_draft_tokens=10)).run(specs)
    compared = 0
    for req, (tokens, scores, parents) in enumerate(seen[0]):
        drafts = chain[(chain.step == 1) & (chain.req_id == req)].sort_values("draft_index")
        node = 0
        for d, row in enumerate(drafts.itertuples()):
            if d > 0:
                children = [c for c in range(len(parents)) if parents[c] == node]
                if not children:
                    break          # the chain's node did not reach the frontier
                node = children[0]
            lp = scores[node] - (scores[parents[node]] if parents[node] >= 0 else 0.0)
            assert abs(lp - row.draft_logprob) < 1e-4, (req, d)
            if row.draft_top2_gap > 1e-4:       # not a near tie: the same argmax
                assert tokens[node] == row.draft_token, (req, d)
            compared += 1
    assert compared >= 2 * len(specs), "the comparison reached below depth 1"
