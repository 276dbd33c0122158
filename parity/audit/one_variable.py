"""One variable at a time: the control, each candidate alone, then (when asked) delta debugging over them.

Both diagnosers test a hypothesis the same way: the re-captures of
`recaptures.stage` (run by `GraphAudit`'s localisation and by the harness
bisector's last stage) and the bisector's eager re-runs (`diagnose/host_moves.py`). A candidate is one thing
that differs between what the graph was captured with and the live state (a
host value, an input absent at capture); `restores(subset)` re-runs the
forward (a re-capture and replay, or an eager re-run) with exactly the
candidates of `subset` at their live values and every other one as captured,
and says whether bitwise parity with the reference comes back.

- the control, `restores([])`: every candidate as captured. When it restores
  parity no candidate can be the cause (something else about the original
  capture is), and no single experiment runs;
- each candidate alone, in the order given (stopping at the first that
  restores parity when `first`);
- when `minimise` and no single one restores parity but all together do,
  delta debugging (`delta_debug.ddmin`) finds the smallest set that does.

The repairs (`repairs.py`: copy the live or the reference's values into what
the graph read) are candidates too, of a forward known to diverge: there is
no control to run, all repairs together must restore parity first
(`together`), then each alone in order of specificity, then delta debugging.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.audit.delta_debug import ddmin


@dataclass
class Search:
    control: bool                                   # every candidate as captured restores parity
    singles: list = field(default_factory=list)     # (candidate, restores) for each one tried alone, in order
    smallest: list = field(default_factory=list)    # no single one restores parity, this smallest set does

    @property
    def restoring(self) -> list:
        """The candidates that restore parity alone, in the order tried."""
        return [c for c, restores in self.singles if restores]


def search(candidates, restores, first: bool = False, minimise: bool = False, together: bool = False) -> Search:
    """The control, then each candidate alone at its live value, then (`minimise`) the smallest set.

    `together`: the candidates are repairs of a run known to diverge (no control to run): all of them at once
    must restore parity before any is tried alone, and a lone candidate that does is the one."""
    candidates = list(candidates)
    if together:
        if not candidates or not restores(candidates):
            return Search(False)
        if len(candidates) == 1:
            return Search(False, [(candidates[0], True)])
    elif restores([]):
        return Search(True)
    found = Search(False)
    for candidate in candidates:
        found.singles.append((candidate, restores([candidate])))
        if first and found.singles[-1][1]:
            return found
    if minimise and not found.restoring and len(candidates) > 1 and (together or restores(candidates)):
        found.smallest = ddmin(candidates, restores)
    return found
