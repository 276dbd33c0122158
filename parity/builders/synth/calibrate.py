"""Calibrating a synthetic target: the branch scale at which its greedy token agrees with the draft's bigram.

Agreement is measured on a fixed, seeded batch of token sequences (drawn from
the frequent tokens: the text a draft vocabulary is chosen to cover) with the
target's own forward through transformers' stock attention: at each position,
is argmax target(tokens[: t + 1]) the draft's bigram of tokens[t]? That is the
event "the first draft token is accepted" of greedy EAGLE decoding.

The search walks a 1-3-10 ladder of scales from START (smaller scale, higher
agreement) until the request is bracketed, then bisects on the log scale, and
keeps the scale whose agreement came closest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import LlamaForCausalLM

from parity.builders.synth.spec import SynthShape
from parity.builders.synth.weights import branch_free_hidden, set_branch_scale

LADDER = (1.0, 3e-1, 1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7, 1e-7)
START = 1e-2
BISECT_STEPS = 6
TOLERANCE = 0.01          # stop bisecting once the agreement is this close to the request
NUM_SEQUENCES, SEQUENCE_LEN = 8, 64   # 512 positions: a few milliseconds even at 8B on a GPU


@dataclass(frozen=True)
class Trial:
    scale: float
    agreement: float


@dataclass(frozen=True)
class Calibration:
    requested: float
    scale: float              # of the target's o_proj/down_proj, relative to Llama's init
    agreement: float          # measured at `scale` on `positions` positions
    trials: tuple[Trial, ...]
    positions: int


def calibration_tokens(frequent: torch.Tensor, seed: int) -> torch.Tensor:
    """[NUM_SEQUENCES, SEQUENCE_LEN] token ids drawn uniformly from `frequent` (seeded, on the CPU)."""
    generator = torch.Generator().manual_seed(seed + 1)
    picks = torch.randint(frequent.numel(), (NUM_SEQUENCES, SEQUENCE_LEN), generator=generator)
    return frequent[picks]


@torch.no_grad()
def bigram(model: LlamaForCausalLM, shape: SynthShape, ids: torch.Tensor,
           allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The draft's prediction after each of `ids`: the target's greedy token with its scaled branches off,
    over the `allowed` ids only when given (EAGLE-3's draft vocabulary)."""
    weight = model.lm_head.weight
    if allowed is not None:
        weight = weight[allowed.to(weight.device)]
    logits = torch.nn.functional.linear(branch_free_hidden(model, shape, ids), weight).float()
    best = logits.argmax(-1)
    return allowed.to(best.device)[best] if allowed is not None else best


@torch.no_grad()
def agreement(model: LlamaForCausalLM, tokens: torch.Tensor, expected: torch.Tensor) -> float:
    """Share of positions whose greedy target token equals `expected` (the bigram of the token there)."""
    hidden = model.model(input_ids=tokens, use_cache=False).last_hidden_state
    predicted = model.lm_head(hidden).float().argmax(-1)
    return float((predicted == expected).float().mean())


def _closest(trials: list[Trial], requested: float) -> Trial:
    return min(trials, key=lambda t: (abs(t.agreement - requested), -t.scale))


def search_scale(measure: Callable[[float], float], requested: float,
                 progress: Callable[[str], None] = lambda line: None) -> tuple[float, float, tuple[Trial, ...]]:
    """(scale, agreement, trials): the scale whose measured agreement is closest to `requested`.

    `measure(scale)` must be non-increasing in the scale, roughly: a smaller scale
    leaves the target closer to the bigram.
    """
    trials: list[Trial] = []

    def run(scale: float) -> float:
        value = measure(scale)
        trials.append(Trial(scale, value))
        progress(f"  scale {scale:.3g}: agreement {value:.3f}")
        return value

    start = LADDER.index(START)
    low = high = None                    # low: agreement >= requested; high: agreement < requested
    if run(START) >= requested:
        low = START
        for scale in reversed(LADDER[:start]):
            if run(scale) < requested:
                high = scale
                break
            low = scale
    else:
        high = START
        for scale in LADDER[start + 1:]:
            if run(scale) >= requested:
                low = scale
                break
            high = scale
    for _ in range(BISECT_STEPS if low is not None and high is not None else 0):
        if abs(_closest(trials, requested).agreement - requested) <= TOLERANCE:
            break
        middle = (low * high) ** 0.5
        if run(middle) >= requested:
            low = middle
        else:
            high = middle
    best = _closest(trials, requested)
    return best.scale, best.agreement, tuple(trials)


def calibrate(model: LlamaForCausalLM, shape: SynthShape, frequent: torch.Tensor, seed: int, requested: float,
              restrict: bool, progress: Callable[[str], None] = lambda line: None) -> Calibration:
    """Search the target's branch scale for `requested` agreement; leave `model` at the chosen scale.

    `restrict`: the draft picks among the frequent tokens only (EAGLE-3's draft vocabulary).
    """
    device = model.lm_head.weight.device
    tokens = calibration_tokens(frequent, seed).to(device)
    expected = bigram(model, shape, tokens, frequent if restrict else None)

    def measure(scale: float) -> float:
        set_branch_scale(model, shape, seed, scale)
        return agreement(model, tokens, expected)

    scale, value, trials = search_scale(measure, requested, progress)
    set_branch_scale(model, shape, seed, scale)
    return Calibration(requested, scale, value, trials, tokens.numel())
