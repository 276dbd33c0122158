"""WRONG_GRAPH and DESCRIPTOR_MISMATCH: a batch looked up a graph captured for another key, or shape, than its own.

Every graph records what it was captured for (owner, phase, runtime mode,
padded descriptor: `graphs.descriptor.CapturedFor`), and the graph runner
checks it against the dispatch before every replay: a mismatch, whatever lookup
found the graph (a key that ignores a field, a size search off by one), stops
the graph run there (`WrongGraph`). The one-variable experiment then replays,
on that forward's pre-state, a graph captured for what the batch asked for:
the one captured for it, else one captured now from the dispatched phase's
forward at the dispatched shape; bitwise parity with the reference confirms
the lookup. WRONG_GRAPH when the graph belongs to another phase, owner or
runtime mode (another forward's kernels would run), DESCRIPTOR_MISMATCH when
only the padded shape differs (rows beyond the batch are phantom requests).
The fields that differ are named, both graphs described.

The check passes when the dispatcher's own descriptor names a graph captured
at another shape than the batch it padded: that is DESCRIPTOR_MISMATCH found
at the divergent forward (`diagnose`).
"""

from __future__ import annotations

from parity.diagnosis.kinds import DESCRIPTOR_MISMATCH, WRONG_GRAPH
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.graphs.modes import PIECEWISE
from parity.graphs.tp_agree import agree_same


def shape_differs(dispatch, entry) -> bool:
    """The graph of the dispatched key was captured at another shape than the batch's padding."""
    return (entry.num_tokens, entry.num_reqs) != (dispatch.num_tokens_padded, dispatch.num_reqs_padded)


def kind_of(fields: list[str]) -> str:
    return WRONG_GRAPH if set(fields) - {"descriptor"} else DESCRIPTOR_MISMATCH


def stage(lab: Divergence) -> Diagnosis | None:
    """DESCRIPTOR_MISMATCH when the dispatcher's own descriptor names a graph of another shape than the batch it
    padded (the graph is the one captured for the key: the replay check passed)."""
    d, entry = lab.dispatch, lab.entry
    if not agree_same("descriptor: graph shape differs from the padding", shape_differs(d, entry)):
        return None
    evidence = [f"the batch was padded to {d.num_tokens_padded} tokens x {d.num_reqs_padded} rows, but its "
                f"descriptor names the graph captured for {entry.num_tokens} tokens x {entry.num_reqs} rows: "
                "rows beyond the batch are read from whatever the buffers held"]
    return lab.diagnosis(DESCRIPTOR_MISMATCH, ["descriptor"], evidence=evidence,
                         experiment="compare the batch's padded shape with its graph's capture shape")


def stopped(lab: Divergence, wrong) -> Diagnosis:
    """The diagnosis of a graph run the replay check stopped (`WrongGraph`) at the lab's forward (its pre
    event in the graph run: nothing replayed yet; the reference's outputs of that forward)."""
    ev_g, executor = lab.ev_g, lab.executor
    fields = wrong.replayed.differing(wrong.wanted)
    experiment, restored = _right_graph(lab)
    evidence = _evidence(ev_g, wrong.replayed, executor, fields, experiment if restored else None)
    if not restored:
        evidence.append(f"{experiment}: parity is not restored either; another difference remains")
    d = ev_g.dispatch
    return lab.diagnosis(kind_of(fields), fields, evidence=evidence,
                         experiment=experiment if restored else "the replay check: what the graph found was "
                         "captured for against what the dispatch asked for",
                         graph={"runtime_mode": d.runtime_mode, "num_tokens": d.num_tokens_padded,
                                "num_reqs": d.num_reqs_padded})


def _evidence(ev_g, replayed, executor, fields, experiment) -> list[str]:
    d = ev_g.dispatch
    found = [f"the batch ({d.num_tokens} real tokens, {d.num_reqs} real rows, padded to {d.num_tokens_padded} "
             f"tokens x {d.num_reqs_padded} rows) asked for the {executor.wanted(d).describe()}, but the lookup "
             f"found the {replayed.describe()}, differing in {', '.join(fields)}"]
    if experiment:
        found.append(f"{experiment}: bitwise parity with the padded reference restored")
    return found


def _right_graph(lab: Divergence) -> tuple[str, bool]:
    """Replay a graph captured for the dispatched key on the forward's pre-state: (the experiment, whether its
    outputs equal the reference's bit for bit)."""
    executor = lab.executor
    wanted = executor.wanted(lab.dispatch)
    right = next((e.graph for e in executor.graphs.values() if e.captured_for == wanted), None)
    if right is not None:
        experiment = f"replay the {wanted.describe()} instead of the graph the lookup found"
    else:
        right = _captured_now(lab, wanted)
        experiment = f"capture the {wanted.describe()} now (none was captured for it) and replay it instead"
    if right is None:
        return experiment, False
    return experiment, lab.matches(lab.run(graph=right))


def _captured_now(lab: Divergence, wanted):
    """A graph of the dispatched phase's forward captured at the dispatched shape on the live metadata."""
    try:
        return lab.recapture(meta=lab.ev_g.meta, phase=wanted.phase, piecewise=wanted.runtime_mode == PIECEWISE)
    except (RuntimeError, IndexError, ValueError):    # the forward cannot be captured here: no experiment
        return None
