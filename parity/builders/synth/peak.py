"""Calibrating the peak of a synthetic pair: the logit scale at which the draft's top token holds `requested`
of its probability on average.

With Llama's init the bigram the heads draft is nearly flat over a real
vocabulary: at 8B its logits have std 0.02 x sqrt(4096) = 1.28 over 128256
tokens, and the EAGLE-1 head (no final norm) sees them at 1/50 of that, so
every draft's log-probability is about -log(128256) and a tree's best nodes
by cumulative log-probability never get past depth 2. Real EAGLE heads put
0.3-0.9 of their mass on their top token. So a pair with a requested peak
gets one logit scale S: the target's final norm weight is S (its logits are S
times those at unit weight, the argmax unchanged) and every head is built to
draft the same bigram distribution at S (weights.py, mtp_weights.py).

S is found on the calibration tokens: peak(S) is the mean over positions of
the largest probability of softmax(S z), z the bigram logits at unit weight
(over the draft vocabulary for EAGLE-3). peak is nondecreasing in S (each
exp(S (z_j - z_max)) shrinks as S grows), so doubling brackets the request
and bisection on log S closes in on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM

from parity.builders.synth.spec import SynthShape
from parity.builders.synth.weights import branch_free_residual

FIRST_SCALE = 1.0
MAX_DOUBLINGS = 16
BISECT_STEPS = 24
PEAK_TOLERANCE = 0.005


@dataclass(frozen=True)
class Peak:
    requested: float
    scale: float              # S: the target's final norm weight (the heads' output scale follows it)
    peak: float               # the bigram's mean top-1 probability at `scale`, measured on `positions` positions
    head_gain: float          # EAGLE-1: its output scale g = S / rms(branch-free residual), logits at S
    trials: tuple[tuple[float, float], ...]   # (scale, peak) in the order tried
    positions: int


@torch.no_grad()
def mean_top1(logits: torch.Tensor) -> float:
    """Mean over rows of the largest softmax probability of fp32 `logits` [..., vocab]."""
    return float(torch.softmax(logits.float(), dim=-1).amax(-1).mean())


@torch.no_grad()
def bigram_logits(model: LlamaForCausalLM, shape: SynthShape, tokens: torch.Tensor,
                  allowed: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """([positions, vocab] fp32 bigram logits, eps-rms of the branch-free residual), the target's final norm
    weight still at its unit init (calibrate_peak runs before anything sets it)."""
    residual = branch_free_residual(model, shape, tokens.reshape(-1))
    eps = model.model.norm.variance_epsilon
    rms = (residual.float().pow(2).mean() + eps).sqrt()
    weight = model.lm_head.weight if allowed is None else model.lm_head.weight[allowed.to(residual.device)]
    return torch.nn.functional.linear(model.model.norm(residual), weight).float(), float(rms)


@torch.no_grad()
def search_peak(logits: torch.Tensor, requested: float, representable) -> tuple[float, float, tuple]:
    """(S, peak(S), trials): the scale whose peak is closest to `requested`; `representable(S)` rounds a
    scale to what the weights' dtype stores, so the peak is measured at the scale the pair holds."""
    trials: list[tuple[float, float]] = []
    centred = logits.float() - logits.float().amax(-1, keepdim=True)     # <= 0, the top token at 0

    def run(scale: float) -> float:
        scale = representable(scale)
        # top-1 probability = 1 / sum_j exp(S (z_j - z_max)): one exp per logit, no softmax
        trials.append((scale, float((centred * scale).exp_().sum(-1).reciprocal_().mean())))
        return trials[-1][1]

    # bracket: peak(low) < requested <= peak(high), doubling up from FIRST_SCALE (or halving down)
    low = high = FIRST_SCALE
    up = run(FIRST_SCALE) < requested
    for _ in range(MAX_DOUBLINGS):
        if up:
            low, high = high, 2 * high
            if run(high) >= requested:
                break
        else:
            high, low = low, low / 2
            if run(low) < requested:
                break
    for _ in range(BISECT_STEPS if low < high else 0):
        closest = min(trials, key=lambda t: abs(t[1] - requested))
        if abs(closest[1] - requested) <= PEAK_TOLERANCE:
            break
        middle = (low * high) ** 0.5
        if run(middle) >= requested:
            high = middle
        else:
            low = middle
    scale, peak = min(trials, key=lambda t: (abs(t[1] - requested), t[0]))
    return scale, peak, tuple(trials)


@torch.no_grad()
def calibrate_peak(model: LlamaForCausalLM, shape: SynthShape, tokens: torch.Tensor, requested: float,
                   allowed: torch.Tensor | None) -> Peak:
    """Search S for a mean top-1 of `requested`; leave the target's final norm weight at S."""
    logits, rms = bigram_logits(model, shape, tokens, allowed)
    dtype = model.model.norm.weight.dtype
    representable = lambda s: float(torch.tensor(s, dtype=dtype))   # noqa: E731
    scale, peak, trials = search_peak(logits, requested, representable)
    model.model.norm.weight.fill_(scale)
    return Peak(requested, scale, peak, scale / rms, trials, logits.shape[0])
