"""The stages under tensor parallelism: the same candidates, the same experiments, the same diagnosis on every rank.

A stage draws its candidates from the rank's own state (the buffers its graph
read, the roles its reference reads, the views that drifted), and a TP fault
can strike one rank only: rank 1's seq_lens rebound, rank 0's right. Every
rank must still run the same experiments in the same order (their forwards
hold collectives), so a stage's candidates are the union over the ranks
(`candidates`): a candidate found on one rank is tried on every rank, a no-op
where that rank has nothing to change, and since the all-reduce mixes every
rank's partials, the repair on the rank that was wrong restores parity on all.
A candidate is described the same on every rank (the first rank's account of
it, with the ranks that have it), so the diagnosis is too (`shared`). Outside
a TP run both are the identity.
"""

from __future__ import annotations

import dataclasses

from parity.diagnosis.record import Diagnosis
from parity.graphs.tp_agree import active, first_found, gather


@dataclasses.dataclass
class Candidate:
    key: str              # the same on every rank that has it: what the experiment changes
    local: object         # this rank's candidate (what it applies); None: this rank has nothing to change
    described: dict       # the candidate as the first rank that has it describes it (the same on every rank)
    ranks: list[int]      # the ranks that have it


def candidates(label: str, local: dict[str, object], describe) -> list[Candidate]:
    """Every rank's candidates, keyed: rank 0's first, then each later rank's new ones; `describe(candidate)`
    gives the JSON account a rank posts of its own."""
    posted = gather(label, [[key, describe(c)] for key, c in local.items()])
    merged: dict[str, Candidate] = {}
    for rank, entries in enumerate(posted):
        for key, described in entries:
            if key not in merged:
                merged[key] = Candidate(key, local.get(key), described, [])
            merged[key].ranks.append(rank)
    return list(merged.values())


def where(candidate: Candidate, world: int) -> str:
    """"" when every rank has the candidate; else which ranks do (a bug of some ranks only)."""
    if len(candidate.ranks) == world:
        return ""
    return f" (on rank{'s' if len(candidate.ranks) > 1 else ''} {', '.join(map(str, candidate.ranks))} only)"


def shared(label: str, local: Diagnosis | None) -> Diagnosis | None:
    """The diagnosis of the first rank that has one, the same on every rank (every rank agreed the experiment
    restored parity; a rank with nothing to change there has no account of its own)."""
    if not active():
        return local
    found, rank = first_found(label, None if local is None else local.as_dict())
    if found is None:
        return None
    diagnosis = Diagnosis(**found)
    if rank:
        diagnosis.evidence.append(f"as rank {rank} describes it (every rank ran the same experiments; a rank with "
                                  "nothing to change ran each unchanged)")
    return diagnosis
