"""Ranks agree on every data-dependent decision before anyone branches on it (a TP run's bisection).

Under tensor parallelism a forward holds collectives, so every rank must run
the same forwards in the same order: when a bisection decides from per-rank
data (does this forward differ, did this experiment restore parity, which
buffers to repair), each rank posts its answer and takes the ranks' common
one. Because the all-reduce mixes every rank's partials, a bug on one rank
shows in every rank's outputs; so a forward diverges if it does on any rank
(`agree_any`), an experiment restores parity only if it does on every rank
(`agree_all`), and a candidate found on one rank is tried on every rank (a
no-op where that rank has nothing to change: `agree_union`). A value that must
be the same everywhere and is not ends the run as RANK_DIVERGENCE naming the
decision (`agree_same`), and a rank that never posts is named stalled within
the timeout, never a hang.

The answers go through the ranks' key-value store (as the descriptors of
`rank_guard` do), apart from the collectives' communicator: each posted value
carries its decision's label, so ranks that reach different decisions are
named, not paired. Outside a TP run every function is the identity: no store,
no wait.
"""

from __future__ import annotations

import json

from parity.graphs.rank_guard import RankDivergence
from parity.models.tp import current, peer_storages


class DecisionsParted(RankDivergence):
    """Ranks reached another decision, or another value of one that must be the same on every rank."""

    def __init__(self, rank: int, ordinal: int, label: str, expected: str, found: str | None, seen_by: int):
        super().__init__(rank, ordinal, label, expected, found, seen_by)
        what = "never posted its decision (stalled)" if found is None else f"decided {found}"
        self.args = (f"rank {rank} {what} at decision {ordinal} ({label}), where rank 0 decided {expected}",)


def active() -> bool:
    """A TP run of more than one rank, whose ranks can exchange decisions."""
    ctx = current()
    return ctx is not None and ctx.world > 1 and ctx.store is not None


def peer_memory() -> set[int]:
    """Storages this rank maps that another rank owns: that rank's lockstep puts them back, never this one's
    (restoring a peer's memory from here would race with the peer writing it)."""
    return peer_storages() if active() else set()


def world() -> int:
    """The ranks that agree (1 outside a TP run)."""
    return current().world if active() else 1


def gather(label: str, value) -> list:
    """Every rank's `value` (JSON-able), in rank order; `[value]` outside TP. Ranks that posted another
    `label` (they are at another decision) raise `DecisionsParted`, as does a rank silent past the timeout."""
    ctx = current()
    if not active():
        return [value]
    ordinal = ctx.agreements
    ctx.agreements += 1
    keys = [f"agree/{ordinal}/{r}" for r in range(ctx.world)]
    ctx.store.set(keys[ctx.rank], json.dumps({"label": label, "value": value}))
    try:
        ctx.store.wait(keys, ctx.timeout)
    except Exception:      # the store says only that it timed out: ask it who is missing
        missing = [r for r, key in enumerate(keys) if not ctx.store.check([key])]
        raise DecisionsParted(missing[0] if missing else -1, ordinal, label, label, None, ctx.rank) from None
    posted = [json.loads(ctx.store.get(key).decode()) for key in keys]
    for rank, entry in enumerate(posted):
        if entry["label"] != posted[0]["label"]:
            raise DecisionsParted(rank, ordinal, posted[0]["label"], posted[0]["label"], entry["label"], ctx.rank)
    return [entry["value"] for entry in posted]


def agree_all(label: str, flag: bool) -> bool:
    """True only if `flag` holds on every rank (an experiment restores parity only where it does everywhere)."""
    return all(gather(label, bool(flag)))


def agree_any(label: str, flag: bool) -> bool:
    """True if `flag` holds on any rank (a forward diverges if it diverges on one rank)."""
    return any(gather(label, bool(flag)))


def agree_union(label: str, keys: list[str]) -> list[str]:
    """Every rank's keys, rank 0's first, then each later rank's new ones, in their order."""
    merged: list[str] = []
    for found in gather(label, list(keys)):
        merged += [k for k in found if k not in merged]
    return merged


def agree_same(label: str, value):
    """`value`, which must be the same on every rank; `DecisionsParted` naming the first rank that differs."""
    posted = gather(label, value)
    for rank, found in enumerate(posted):
        if found != posted[0]:
            ctx = current()
            raise DecisionsParted(rank, ctx.agreements - 1, label, json.dumps(posted[0]), json.dumps(found),
                                  ctx.rank)
    return value


def first_found(label: str, value):
    """(the first rank's non-None `value`, that rank), in rank order; (None, None) when no rank has one."""
    for rank, found in enumerate(gather(label, value)):
        if found is not None:
            return found, rank
    return None, None


def merged_lines(label: str, lines: list[str]) -> list[str]:
    """Evidence every rank can give alike: the lines when every rank has the same, else each rank's lines
    under its rank's name (the same list on every rank)."""
    posted = gather(label, list(lines))
    if all(found == posted[0] for found in posted):
        return list(lines)
    return [f"rank {rank}: {line}" for rank, found in enumerate(posted) for line in found]
