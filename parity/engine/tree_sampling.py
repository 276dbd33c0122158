"""Sampled tree verification (temperature > 0): which path of a tree the target accepts, and the token after it.

The drafter's tree is deterministic (the `topk` best children of each node,
whatever the temperature), so each child is a point-mass proposal and the
draft's probabilities play no part: SGLang's target-only tree rule
(`tree_speculative_sampling_target_only`, thresholds 1). At an accepted node u,
with p the target's distribution softmax(logits / T) at u's verify row and
u's children x_1..x_m (best-scored first), one uniform coin c decides:

- child i is accepted when p(x_1) + ... + p(x_{i-1}) < c <= p(x_1) + ... + p(x_i):
  each child with probability p(x_i) exactly;
- when c is above the children's total, no child is: the emitted token is a
  sample of p with the children's tokens removed (renormalised), probability
  (1 - sum p(x_i)) * p(y) / (1 - sum p(x_i)) = p(y) for every other y.

So the token decided at every depth is distributed exactly as the target's
p there (lossless), and the walk goes on from an accepted child. Children hold
distinct tokens (top-k), so the cases do not overlap. The coin and the
residual sample are keyed by (seed, request, the position the token is decided
for) like the chain's sampler (`rng.py`): every mode, batch order and padding
draws the same numbers. Eager, on the host, after the verify forward.
"""

from __future__ import annotations

import torch

from parity.engine.rng import STREAM_ACCEPT, STREAM_RECOVER, sample_categorical, uniform
from parity.engine.tree import DraftTree


def choose_child(p: torch.Tensor, tokens: list[int], coin: float) -> int | None:
    """Index into `tokens` of the accepted child under `coin`, None when no child is ([V] float64 p)."""
    total = 0.0
    for i, token in enumerate(tokens):
        total += float(p[token])
        if coin <= total:
            return i
    return None


def residual_logits(p: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """log p with the rejected children's tokens removed (-inf): the unnormalised log-weights sampled from."""
    logp = torch.log(p)
    if tokens:
        logp[torch.tensor(tokens, device=p.device)] = float("-inf")
    return logp


def accept_sampled(tree: DraftTree, logits: torch.Tensor, temperature: float, seed: int, req_id: int,
                   first_position: int) -> tuple[list[int], int]:
    """(accepted path, the target's token after it) of one request's tree.

    `logits` [1 + nodes, V]: the root's row, then node i's at 1 + i; the token
    decided at depth d is for position `first_position + d`.
    """
    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
    path: list[int] = []
    node = -1
    req = torch.tensor([req_id], device=logits.device)
    while True:
        position = torch.tensor([first_position + len(path)], device=logits.device)
        p = probs[0 if node < 0 else 1 + node]
        children = tree.children(node)
        tokens = [tree.tokens[c] for c in children]
        coin = float(uniform(seed, req, position, STREAM_ACCEPT, dtype=torch.float64)[0])
        pick = choose_child(p, tokens, coin)
        if pick is None:
            last = sample_categorical(residual_logits(p, tokens).unsqueeze(0), seed, req, position, STREAM_RECOVER)
            return path, int(last[0])
        node = children[pick]
        path.append(node)
