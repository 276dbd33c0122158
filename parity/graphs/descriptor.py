"""Batch descriptors and dispatch decisions: the graph key is data."""

from __future__ import annotations

from dataclasses import dataclass

# The forwards of one engine step: the target's verify, the drafter's prefill and decode steps.
PHASES = ("verify", "draft_prefill", "draft_step")


@dataclass(frozen=True)
class BatchDescriptor:
    """What a graph is keyed by (vLLM's BatchDescriptor)."""

    num_tokens: int
    num_reqs: int | None   # None: not uniform, rows padded like tokens
    uniform: bool


@dataclass(frozen=True)
class Dispatch:
    """Which way one forward runs, and its padded shape."""

    phase: str
    runtime_mode: str               # "eager", "piecewise" or "full"
    num_tokens: int                 # actual
    num_reqs: int                   # actual
    num_tokens_padded: int
    num_reqs_padded: int
    descriptor: BatchDescriptor | None   # None when eager

    @property
    def padded(self) -> bool:
        return self.num_tokens_padded != self.num_tokens or self.num_reqs_padded != self.num_reqs


def eager_dispatch(phase: str, num_tokens: int, num_reqs: int) -> Dispatch:
    return Dispatch(phase, "eager", num_tokens, num_reqs, num_tokens, num_reqs, None)


class EagerExecutor:
    """Runs every forward eagerly at its exact shape (mode NONE)."""

    mode = "eager"

    def dispatch(self, phase: str, num_tokens: int, num_reqs: int, uniform: bool) -> Dispatch:
        return eager_dispatch(phase, num_tokens, num_reqs)

    def execute(self, dispatch: Dispatch, fn, meta):
        return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)
