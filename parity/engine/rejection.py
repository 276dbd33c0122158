"""Speculative-decoding rejection sampler (Leviathan et al. 2023; Chen et al.
2023), vectorised over requests and draft positions.

Shapes: R requests, K draft tokens each, V vocabulary. The token decided at
draft index i (i = 0..K, K being the bonus) sits at absolute position
``first_positions[r] + i``; that position, the request id and the seed are all
the randomness depends on (see rng.py), so every graph mode, batch order and
padding draws the same numbers.

No function here reads a tensor on the host: ``temperature`` and ``seed`` are
Python numbers fixed for a run, so the code is CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from parity.engine.rng import (
    STREAM_ACCEPT,
    STREAM_BONUS,
    STREAM_DRAFT,
    STREAM_RECOVER,
    sample_categorical,
    uniform,
)

__all__ = ["rejection_sample", "sample_target", "draft_distribution", "sample_draft"]

PAD = -1  # output slots after the emitted token


def is_greedy(temperature: float) -> bool:
    return float(temperature) <= 0.0


def one_hot(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [N, vocab] with a 1 at each row's id ([N])."""
    # scatter instead of F.one_hot: one_hot range-checks its input on the host.
    out = torch.zeros((ids.shape[0], vocab), dtype=torch.float32, device=ids.device)
    return out.scatter_(-1, ids.unsqueeze(-1), 1.0)


def draft_distribution(draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The distribution the drafter samples from: softmax(logits / T), or a
    one-hot of the argmax when greedy. [N, V] -> float32 [N, V]."""
    if is_greedy(temperature):
        return one_hot(draft_logits.argmax(-1), draft_logits.shape[-1])
    return torch.softmax(draft_logits.to(torch.float32) / temperature, dim=-1)


def sample_draft(
    draft_logits: torch.Tensor,
    *,
    temperature: float,
    seed: int,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """A draft token per row, drawn from draft_distribution(draft_logits, T):
    argmax when greedy, else Gumbel-max on stream STREAM_DRAFT. [N, V] -> [N]."""
    if is_greedy(temperature):
        return draft_logits.argmax(-1)
    logq = torch.log_softmax(draft_logits.to(torch.float32) / temperature, dim=-1)
    return sample_categorical(logq, seed, req_ids, positions, STREAM_DRAFT)


def sample_target(
    target_logits: torch.Tensor,
    *,
    temperature: float,
    seed: int,
    req_ids: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The target's own token for requests without drafts (e.g. after a
    prefill): argmax, or a sample of softmax(logits / T) on STREAM_BONUS, the
    stream of the token that follows the last accepted draft. [R, V] -> [R]."""
    if is_greedy(temperature):
        return target_logits.argmax(-1)
    logp = torch.log_softmax(target_logits.to(torch.float32) / temperature, dim=-1)
    return sample_categorical(logp, seed, req_ids, positions, STREAM_BONUS)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    *,
    temperature: float,
    seed: int,
    req_ids: torch.Tensor,
    first_positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify K draft tokens per request against the target.

    draft_tokens [R, K] int, draft_probs [R, K, V] (the draft's sampling
    distribution q; may be None when greedy), target_logits [R, K+1, V].

    Returns (output_tokens [R, K+1], num_accepted [R]): row r holds its
    num_accepted[r] accepted drafts, then one token from the target (the
    recovered token at the first rejection, or the bonus when all K were
    accepted), then PAD (-1). num_accepted[r] is in 0..K.
    """
    R, K = draft_tokens.shape
    draft_tokens = draft_tokens.to(torch.int64)
    idx = torch.arange(K + 1, device=draft_tokens.device)  # draft index i
    pos = first_positions.to(torch.int64)[:, None] + idx  # [R, K+1] absolute positions
    req = req_ids.to(torch.int64)[:, None]  # [R, 1], broadcasts with pos

    if is_greedy(temperature):
        # Greedy verification: draft i is accepted while it equals the target
        # argmax; at the first mismatch (or at K) the target argmax is emitted.
        target = target_logits.argmax(-1)  # [R, K+1]
        accept = draft_tokens == target[:, :K]
        candidates = target  # the token emitted at index n = num_accepted
    else:
        if draft_probs is None:
            raise ValueError("rejection_sample: draft_probs is required when temperature > 0")
        accept, candidates = _stochastic(draft_tokens, draft_probs, target_logits, temperature, seed, req, pos)

    # Acceptance stops at the first rejection: n = length of the all-true prefix.
    num_accepted = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [R]
    n = num_accepted[:, None]
    drafts = torch.cat([draft_tokens, draft_tokens.new_full((R, 1), PAD)], dim=1)
    out = torch.where(idx < n, drafts, torch.where(idx == n, candidates, PAD))
    return out, num_accepted


def _stochastic(draft_tokens, draft_probs, target_logits, temperature: float, seed: int, req, pos):
    """(accepted [R, K] bool, candidates [R, K+1]) of the stochastic rule."""
    K = draft_tokens.shape[1]
    p = torch.softmax(target_logits.to(torch.float32) / temperature, dim=-1)  # [R, K+1, V]
    q = draft_probs.to(torch.float32)  # [R, K, V]
    V = p.shape[-1]
    valid = (draft_tokens >= 0) & (draft_tokens < V)  # a PAD draft is never accepted
    d = draft_tokens.clamp(0, V - 1)[..., None]
    p_d = p[:, :K].gather(-1, d).squeeze(-1).to(torch.float64)  # p_i(d_i)
    q_d = q.gather(-1, d).squeeze(-1).to(torch.float64)  # q_i(d_i)

    # Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)):  u <= p/q,
    # written u * q <= p to avoid dividing by q; p == 0 never accepts.
    u = uniform(seed, req, pos[:, :K], STREAM_ACCEPT, dtype=torch.float64)
    accept = valid & (p_d > 0) & (u * q_d <= p_d)

    # On rejection at i, emit a sample of the residual norm(max(p_i - q_i, 0)):
    # q(x) min(1, p/q) + (1 - sum_y min(p, q)) residual(x) = p(x), so the
    # emitted token is distributed exactly as p_i. If the residual is all
    # zeros (p <= q everywhere, i.e. p == q up to rounding) fall back to p_i.
    # Gumbel-max needs no normalisation: log of the unnormalised weights.
    resid = (p[:, :K] - q).clamp_min(0.0)
    resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, p[:, :K])
    recovered = sample_categorical(resid.log(), seed, req, pos[:, :K], STREAM_RECOVER)

    # All K accepted: the bonus token is a plain sample of p_K.
    bonus = sample_categorical(p[:, K].log(), seed, req[:, 0], pos[:, K], STREAM_BONUS)
    return accept, torch.cat([recovered, bonus[:, None]], dim=1)  # [R, K+1]
