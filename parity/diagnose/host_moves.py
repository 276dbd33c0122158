"""Host state the forward advances itself: a counter, an RNG offset, a step index kept on the owner object.

Eager code moves it at every call (`self.calls += 1`, `self.rng_offset += n`);
a capture runs the Python once, and a replay runs none: every replay reads
the value its capture read, and the counter stops. The reference shows it
directly: the owner's host values before and after the divergent forward
(`state.snapshot` holds them, `state.restore` puts them back, so re-runs
start from the same host state) differ at the attribute the forward moved.

Each attribute the reference's forward moved is one variable:

- a graph replay: re-capture the forward (same capture-time metadata, same
  addresses) from the graph run's pre-state with only that attribute at the
  reference's value, and replay; the control re-capture with the value the
  graph was captured with must not restore parity (the audit's re-capture
  experiment, `audit/recaptures.py`, on the attribute's `Path`);
- an eager forward of the graph run (its captures moved the counter, its
  replays did not, so it starts from another value): re-run it from its
  pre-state with only that attribute at the reference's value; unchanged, it
  diverges.

The one that restores bitwise parity is FROZEN_AT_CAPTURE, named by its
attribute path: a Python value the graph baked at capture, which the forward
itself advances.
"""

from __future__ import annotations

from parity.diagnosis.kinds import FROZEN_AT_CAPTURE
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose.state import host_moves
from parity.audit.one_variable import search
from parity.audit.recaptures import HostValue, host_search
from parity.graphs import host_state
from parity.graphs.host_state import short
from parity.graphs.tp_agree import agree_same


def moved_by(snaps: dict, ref, ev_r, graph, ev_g) -> dict:
    """What the divergent forward moved, in each run: {"ref": {path: (before, after)}, "graph": {...}}.
    Call before anything restores the pre-state (the runs stand just after the forward)."""
    return {"ref": host_moves(snaps["ref"], ev_r.owner), "graph": host_moves(snaps["graph"], ev_g.owner)}


def stage(lab: Divergence) -> Diagnosis | None:
    """FROZEN_AT_CAPTURE naming the host value the forward advances itself, or None (each experiment that did
    not restore parity added to `lab.ruled_out`), whether the graph run replayed the forward (`lab.entry`) or
    ran it eagerly."""
    holder, graph_pre = lab.snaps["graph"]["host"][lab.ev_g.owner]
    entry, executor, moves = lab.entry, lab.executor, lab.moves
    moved = [(path, values) for path, values in moves["ref"].items() if path in graph_pre]
    # NOTE: host values every rank's Python moves alike; ranks that differ part here (`graphs.tp_agree`).
    agree_same("host moves: values the forward moved", [host_state.name(path) for path, _ in moved])
    for path, (ref_before, ref_after) in moved:
        name = host_state.name(path)
        found = (_eager(lab, holder, path, ref_before) if entry is None
                 else _replayed(lab, path, ref_before, (ref_before, ref_after)))
        if found is False:
            lab.ruled_out.append(f"{'re-run' if entry is None else 're-capture'} with the reference's value of {name}, "
                             "which the forward advances itself")
        if not found:
            continue
        experiment, control = found
        evidence = [f"{name}: advanced by the forward itself: the reference's forward moved it "
                    f"{short(ref_before)} -> {short(ref_after)}",
                    _graph_side(name, path, graph_pre[path], moves["graph"], entry, executor),
                    f"{experiment}: the forward's outputs equal the padded reference's bit for bit; {control}"]
        return lab.diagnosis(FROZEN_AT_CAPTURE, [name], evidence=evidence, experiment=experiment)
    return None


def _replayed(lab: Divergence, path, value, moved):
    """(experiment, control) when a re-capture with `path` at `value` restores parity and the control
    re-capture with the captured value does not (`audit.recaptures`); None when the graph was captured with
    `value`; False when the experiment failed."""
    baked = lab.entry.captured_host.get(path, lab.snaps["graph"]["host"][lab.ev_g.owner][1][path])
    if agree_same("host moves: captured with the reference's value", host_state.same(baked, value)):
        return None
    name = host_state.name(path)
    if not host_search(lab, [HostValue(path, name, baked, value, moved)]).restoring:
        return False     # any fresh capture restores parity (the value is not what differs), or none does
    return (f"re-capture with {name} at the reference's value {short(value)} (same addresses, one host value "
            "changed)", f"the control re-capture with the value it was captured with ({short(baked)}) does not")


def _eager(lab: Divergence, holder, path, value):
    """(experiment, control) when re-running the eager forward with `path` at `value` restores parity and the
    control re-run from the unchanged pre-state does not; None when the graph run's value is the reference's
    already; False when the experiment failed."""
    if agree_same("host moves: the reference's value already",
                  host_state.same(lab.snaps["graph"]["host"][lab.ev_g.owner][1][path], value)):
        return None
    found = search([path], lambda live: _rerun_matches(lab, holder, {path: value} if live else {}))
    if not found.restoring:
        return False
    name = host_state.name(path)
    return (f"re-run the forward from the graph run's pre-state with only {name} at the reference's value "
            f"{short(value)}", "the control re-run from the unchanged pre-state does not")


class _Unsettable(Exception):
    """A host value the experiment must set cannot be (a frozen dataclass, a property): no re-run."""


def _rerun_matches(lab: Divergence, holder, values: dict) -> bool:
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


def _graph_side(name, path, before, graph_moves, entry, executor) -> str:
    """What the graph run did with the value: its replay left it alone, its captures moved it."""
    if entry is not None:
        text = (f"the graph run's replay left it at {short(before)}" if path not in graph_moves else
                f"the graph run moved it {short(graph_moves[path][0])} -> {short(graph_moves[path][1])}")
        text += f"; the graph was captured with {short(entry.captured_host.get(path, '?'))}"
        if path in entry.capture_moved:
            a, b = entry.capture_moved[path]
            text += f" (its capture moved it {short(a)} -> {short(b)}: a replay runs no Python)"
        return text
    captures = sum(path in e.capture_moved for e in getattr(executor, "graphs", {}).values())
    return (f"this forward runs eagerly in the graph run, where it started at {short(before)}; "
            f"{captures} of the owner's captures moved it, and replays never do")
