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
class CapturedFor:
    """What one graph was captured for, recorded at capture and checked at every replay: a graph replayed for
    another owner, phase, runtime mode or padded descriptor than the batch's runs another forward's kernels."""

    owner: str
    phase: str
    runtime_mode: str
    descriptor: BatchDescriptor

    def differing(self, other: "CapturedFor") -> list[str]:
        """The fields in which `other` differs from this one."""
        return [name for name in ("owner", "phase", "runtime_mode", "descriptor")
                if getattr(self, name) != getattr(other, name)]

    def describe(self) -> str:
        d = self.descriptor
        rows = f" x {d.num_reqs} rows" if d.num_reqs is not None else ""
        return (f"{self.owner} {self.phase} {self.runtime_mode} graph for {d.num_tokens} tokens{rows}"
                + (" (uniform)" if d.uniform else ""))

    def as_dict(self) -> dict:
        d = self.descriptor
        return {"owner": self.owner, "phase": self.phase, "runtime_mode": self.runtime_mode,
                "num_tokens": d.num_tokens, "num_reqs": d.num_reqs, "uniform": d.uniform, "graph": self.describe()}


class WrongGraph(RuntimeError):
    """A batch was about to replay a graph captured for another key than its own (checked before the replay:
    another forward's graph may read past the batch's buffers, which on CUDA poisons the process)."""

    def __init__(self, replayed: CapturedFor, wanted: CapturedFor):
        self.replayed, self.wanted = replayed, wanted
        super().__init__(f"the batch asked for the {wanted.describe()}, but the lookup found the "
                         f"{replayed.describe()}")

    def as_dict(self) -> dict:
        return {"replayed": self.replayed.as_dict(), "wanted": self.wanted.as_dict(),
                "differs": self.replayed.differing(self.wanted)}


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
