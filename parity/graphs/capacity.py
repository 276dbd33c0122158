"""The capacity audit: every persistent buffer holds the largest padded batch a graph will be run at.

A graph is captured, and its padded reference run, at padded shapes: a token
count from the capture sizes, a row count from the requests it is keyed by.
A forward slices each batch-indexed buffer at that shape, and a slice past
the end of a tensor is silently shorter (vLLM #50065: query buffers sized for
the largest real batch, `max_num_seqs * (1 + K)`, padded up to the next
capture size). What follows is a short tensor flowing into the forward:
wrong values in an engine that tolerates it, a shape error far from the
cause in one that does not. The audit checks every buffer against every
padded shape the dispatcher will use, before anything is captured or run,
and names the buffer, its capacity and the shape that needs more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Shortfall:
    """One buffer too short for one padded shape."""

    owner: str
    buffer: str
    capacity: int      # entries along the batch dim
    needed: int        # entries the padded shape slices
    phase: str
    runtime_mode: str
    num_tokens: int    # the padded shape
    num_reqs: int

    def describe(self) -> str:
        return (f"{self.owner}.{self.buffer} holds {self.capacity} entries; a {self.runtime_mode} {self.phase} "
                f"graph of {self.num_tokens} tokens in {self.num_reqs} rows slices {self.needed}")

    def as_dict(self) -> dict:
        return {**asdict(self), "message": self.describe()}


class ShortBuffers(RuntimeError):
    """Padded shapes a mode would run at need more entries than a persistent buffer holds."""

    def __init__(self, mode: str, shortfalls: list[Shortfall]):
        self.mode = mode
        self.shortfalls = shortfalls
        first = shortfalls[0]
        more = f" (and {len(shortfalls) - 1} more)" if len(shortfalls) > 1 else ""
        super().__init__(f"{mode}: {first.describe()}{more}")


def shortfalls(owner, dispatcher) -> list[Shortfall]:
    """Every (buffer, padded shape) of `owner` under `dispatcher` where the buffer is too short.

    One entry per buffer: the smallest padded shape it cannot hold.
    """
    found: dict[str, Shortfall] = {}
    plans = [(forward.phase, entry) for forward in owner.forwards()
             for entry in dispatcher.capture_plan(forward.phase, forward.max_tokens)]
    for phase, (runtime, _descriptor, num_tokens, num_reqs) in sorted(plans, key=lambda p: (p[1][2], p[1][3])):
        for name, tensor in owner.buffers.items():
            spec = owner.buffers.spec(name)
            if spec.index is None or name in found:
                continue
            needed = spec.used(num_tokens, num_reqs).stop
            if tensor.shape[0] < needed:
                found[name] = Shortfall(owner.name, name, int(tensor.shape[0]), needed, phase, runtime,
                                        num_tokens, num_reqs)
    return list(found.values())


def check_capacity(mode: str, owners_and_dispatchers) -> None:
    """Raise ShortBuffers naming every buffer some padded shape of `mode` cannot fit."""
    found = [s for owner, dispatcher in owners_and_dispatchers for s in shortfalls(owner, dispatcher)]
    if found:
        raise ShortBuffers(mode, found)
