"""Host state the forward advances itself: a counter, an RNG offset, a step index kept on the owner object.

Eager code moves it at every call (`self.calls += 1`); a capture runs the
Python once and a replay runs none, so every replay reads the value its capture
read. The reference shows it: the owner's host values before and after the
divergent forward differ at the attribute the forward moved (`Divergence.moves`).
- a graph replay: each such attribute is one of the lab's host values
  (`Divergence.host_values`, by `Path`, the reference's value as the live one,
  what it moved as `moved`), and the audit's re-capture experiments
  (`audit/recaptures.py`) name it FROZEN_AT_CAPTURE, as they name the audit's;
- an eager forward of the graph run (its captures moved the counter, its
  replays did not, so it starts from another value; `stage`): re-run from its
  pre-state with only that attribute at the reference's value, unchanged (the
  control) it diverges: FROZEN_AT_CAPTURE, named by its attribute path.
"""

from __future__ import annotations

from parity.audit.one_variable import search
from parity.diagnosis.kinds import FROZEN_AT_CAPTURE
from parity.diagnosis.record import Diagnosis
from parity.graphs import host_state
from parity.graphs.host_state import short
from parity.graphs.tp_agree import agree_same


def moved(lab) -> list[tuple]:
    """(path, (before, after)) of each host value the reference's forward advanced that the graph run's owner
    holds too (the same on every rank: ranks whose Python moves other values part here)."""
    graph_pre = lab.snaps["graph"]["host"][lab.ev_g.owner][1]
    found = [(path, values) for path, values in lab.moves.items() if path in graph_pre]
    agree_same("host moves: values the forward moved", [host_state.name(path) for path, _ in found])
    return found


def stage(lab) -> Diagnosis | None:
    """FROZEN_AT_CAPTURE naming the host value an eager forward of the graph run starts from at another value than
    the reference (the owner's captures moved it, its replays did not), or None (each re-run that did not
    restore parity added to `lab.ruled_out`)."""
    holder, graph_pre = lab.snaps["graph"]["host"][lab.ev_g.owner]
    for path, (ref_before, ref_after) in moved(lab):
        if agree_same("host moves: the reference's value already", host_state.same(graph_pre[path], ref_before)):
            continue
        name = host_state.name(path)
        if not search([path], lambda live: _rerun_matches(lab, holder, {path: ref_before} if live else {})).restoring:
            lab.ruled_out.append(f"re-run with the reference's value of {name}, which the forward advances itself")
            continue
        experiment = (f"re-run the forward from the graph run's pre-state with only {name} at the reference's "
                      f"value {short(ref_before)}")
        captures = sum(path in e.capture_moved for e in getattr(lab.executor, "graphs", {}).values())
        evidence = [f"{name}: advanced by the forward itself: the reference's forward moved it "
                    f"{short(ref_before)} -> {short(ref_after)}",
                    f"this forward runs eagerly in the graph run, where it started at {short(graph_pre[path])}; "
                    f"{captures} of the owner's captures moved it, and replays never do",
                    f"{experiment}: the forward's outputs equal the padded reference's bit for bit; the control "
                    "re-run from the unchanged pre-state does not"]
        return lab.diagnosis(FROZEN_AT_CAPTURE, [name], evidence=evidence, experiment=experiment)
    return None


class _Unsettable(Exception):
    """A host value the experiment must set cannot be (a frozen dataclass, a property): no re-run."""


def _rerun_matches(lab, holder, values: dict) -> bool:
    """Re-run the eager forward from the graph run's pre-state with `values` put on `holder`."""
    def change():
        if not all(host_state.put(holder, path, value) for path, value in values.items()):
            raise _Unsettable
    try:
        return lab.matches(lab.run(change))
    except _Unsettable:
        return False
    finally:
        lab.restore()
