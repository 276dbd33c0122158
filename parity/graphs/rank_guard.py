"""Ranks agree on every graph forward before it runs, or the run stops with RANK_DIVERGENCE, never a hang.

Under tensor parallelism every rank must replay the same graph (the same
phase, runtime mode and padded shape) at the same moment: a rank that pads to
another capture size launches collectives of another shape, and its peers
wait for ever inside the all-reduce. So before each forward of a graph run
every rank posts its dispatched descriptor to a key-value store shared by the
ranks (apart from the collectives' own group) and waits, under the run's
timeout, for every peer's. A descriptor that differs from rank 0's, or a peer
that never posts, raises `RankDivergence` naming the rank, the forward and
the two descriptors; the harness turns it into the run's verdict.
"""

from __future__ import annotations

from parity.graphs.descriptor import Dispatch
from parity.models.tp import current


class RankDivergence(RuntimeError):
    """Ranks parted before a forward: another descriptor on `rank`, or `rank` never arrived (stalled)."""

    def __init__(self, rank: int, forward: int, mode: str, expected: str, found: str | None, seen_by: int):
        self.rank, self.forward, self.mode = rank, forward, mode
        self.expected, self.found, self.seen_by = expected, found, seen_by
        what = "never posted its descriptor (stalled)" if found is None else f"dispatched {found}"
        super().__init__(f"rank {rank} {what} at forward {forward} of the {mode} run, where rank 0 dispatched "
                         f"{expected}")

    def as_dict(self) -> dict:
        return {"rank": self.rank, "forward": self.forward, "mode": self.mode, "stalled": self.found is None,
                "descriptors": {"rank 0": self.expected, f"rank {self.rank}": self.found},
                "seen_by": self.seen_by, "message": str(self)}


def tp_rank() -> int:
    """This process's tensor-parallel rank (0 outside a TP run)."""
    ctx = current()
    return 0 if ctx is None else ctx.rank


def describe(owner: str, dispatch: Dispatch) -> str:
    """What a forward's ranks must agree on, as one line."""
    return (f"{owner}/{dispatch.phase} {dispatch.runtime_mode} tokens={dispatch.num_tokens}->"
            f"{dispatch.num_tokens_padded} reqs={dispatch.num_reqs}->{dispatch.num_reqs_padded}")


def agree(mode: str, descriptor: str) -> None:
    """Post this rank's descriptor and check every peer's, under the TP timeout; no-op outside TP."""
    ctx = current()
    if ctx is None or ctx.store is None:
        return
    # The store's key counts every exchange of the process; the forward named is this run's ordinal.
    exchange, forward, store = ctx.forwards, ctx.run_forwards, ctx.store
    ctx.forwards += 1
    ctx.run_forwards += 1
    keys = [f"{exchange}/{r}" for r in range(ctx.world)]
    store.set(keys[ctx.rank], descriptor)
    try:
        store.wait(keys, ctx.timeout)
    except Exception:     # the store says only that it timed out: ask it who is missing
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise RankDivergence(missing[0] if missing else -1, forward, mode,
                             descriptor if ctx.rank == 0 else _get(store, keys[0]), None, ctx.rank) from None
    posted = [_get(store, key) for key in keys]
    for rank, text in enumerate(posted):
        if text != posted[0]:
            raise RankDivergence(rank, forward, mode, posted[0], text, ctx.rank)


def _get(store, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


class RankGuard:
    """Mixin over a graph runner: every forward it runs is first agreed with the peer ranks."""

    def __init__(self, owner: str, *args, **kwargs):
        super().__init__(owner, *args, **kwargs)
        ctx = current()
        if ctx is not None and owner == "target":     # the target's runner is installed first in every run
            ctx.run_forwards = 0

    def execute(self, dispatch: Dispatch, fn, meta):
        agree(self.mode, describe(self.owner, dispatch))
        return super().execute(dispatch, fn, meta)
