"""WRONG_GRAPH and DESCRIPTOR_MISMATCH: the forward replayed a graph captured for another key than its batch's.

Every graph records what it was captured for (owner, phase, runtime mode,
padded descriptor: `graphs.descriptor.CapturedFor`), and the dispatch says what
its batch was built for. When they differ, whatever lookup found the graph (a
key that ignores a field, a size search off by one), the one-variable
experiment replays, on the same pre-state, a graph captured for what the batch
asked for: the one captured for it, else one captured now from the dispatched
phase's forward at the dispatched shape. Bitwise parity restored names the
lookup: WRONG_GRAPH when the graph belongs to another phase, owner or runtime
mode (another forward's kernels ran), DESCRIPTOR_MISMATCH when only the padded
shape differs (rows beyond the batch are phantom requests). The fields that
differ are named, both graphs are described.
"""

from __future__ import annotations

from parity.analysis.kinds import DESCRIPTOR_MISMATCH, WRONG_GRAPH
from parity.diagnose.state import executor_of, forward_fn, restore
from parity.graphs.capture import capture
from parity.graphs.modes import PIECEWISE


def mismatch(executor, dispatch, entry) -> list[str]:
    """The fields of what `entry` was captured for that differ from what `dispatch` asks for; 'descriptor'
    also when the graph of the dispatched descriptor was captured at another shape than the batch's padding."""
    found = entry.captured_for.differing(executor.wanted(dispatch)) if entry.captured_for is not None else []
    if not found and (entry.num_tokens, entry.num_reqs) != (dispatch.num_tokens_padded, dispatch.num_reqs_padded):
        found = ["descriptor"]
    return found


def kind_of(fields: list[str]) -> str:
    return WRONG_GRAPH if set(fields) - {"descriptor"} else DESCRIPTOR_MISMATCH


def diagnose(bisector, graph, ev_g, snaps, out_r, executor, entry, fields, **where):
    """The diagnosis of a divergent forward whose graph was looked up for another key or shape, when replaying
    a graph captured for the dispatched key restores parity, else None."""
    d = ev_g.dispatch
    if entry.captured_for == executor.wanted(d):
        # The dispatcher's own descriptor names a graph of another shape than the batch it padded.
        evidence = [f"the batch was padded to {d.num_tokens_padded} tokens x {d.num_reqs_padded} rows, but its "
                    f"descriptor names the graph captured for {entry.num_tokens} tokens x {entry.num_reqs} rows: "
                    "rows beyond the batch are read from whatever the buffers held"]
        return bisector.diagnosis(DESCRIPTOR_MISMATCH, ["descriptor"], ev_g, evidence=evidence,
                                  experiment="compare the batch's padded shape with its graph's capture shape",
                                  **where)
    experiment, restored = _right_graph(bisector, graph, ev_g, snaps, out_r, executor)
    if not restored:
        return None
    return bisector.diagnosis(kind_of(fields), fields, ev_g, evidence=_evidence(ev_g, entry.captured_for,
                                                                                  executor, fields, experiment),
                              experiment=experiment, **where)


def stopped(bisector, graph, ev_g, snaps, out_r, wrong):
    """The diagnosis of a graph run the replay check stopped (`WrongGraph`) at the forward `ev_g` (its pre
    event: nothing replayed yet), with the reference's outputs `out_r` of that forward."""
    executor = executor_of(graph, ev_g.owner)
    fields = wrong.replayed.differing(wrong.wanted)
    experiment, restored = _right_graph(bisector, graph, ev_g, snaps, out_r, executor)
    evidence = _evidence(ev_g, wrong.replayed, executor, fields, experiment if restored else None)
    if not restored:
        evidence.append(f"{experiment}: parity is not restored either; another difference remains")
    d = ev_g.dispatch
    return bisector.diagnosis(kind_of(fields), fields, ev_g, evidence=evidence,
                              experiment=experiment if restored else "the replay check: what the graph found was "
                              "captured for against what the dispatch asked for",
                              graph_info={"runtime_mode": d.runtime_mode, "num_tokens": d.num_tokens_padded,
                                          "num_reqs": d.num_reqs_padded})


def _evidence(ev_g, replayed, executor, fields, experiment) -> list[str]:
    d = ev_g.dispatch
    found = [f"the batch ({d.num_tokens} real tokens, {d.num_reqs} real rows, padded to {d.num_tokens_padded} "
             f"tokens x {d.num_reqs_padded} rows) asked for the {executor.wanted(d).describe()}, but the lookup "
             f"found the {replayed.describe()}, differing in {', '.join(fields)}"]
    if experiment:
        found.append(f"{experiment}: bitwise parity with the padded reference restored")
    return found


def _right_graph(bisector, graph, ev_g, snaps, out_r, executor) -> tuple[str, bool]:
    """Replay a graph captured for the dispatched key on the forward's pre-state: (the experiment, whether its
    outputs equal the reference's bit for bit)."""
    wanted = executor.wanted(ev_g.dispatch)
    right = next((e.graph for e in executor.graphs.values() if e.captured_for == wanted), None)
    if right is not None:
        experiment = f"replay the {wanted.describe()} instead of the graph the lookup found"
    else:
        right = _captured_now(graph, ev_g, snaps, executor, wanted)
        experiment = f"capture the {wanted.describe()} now (none was captured for it) and replay it instead"
    if right is None:
        return experiment, False
    restore(snaps["graph"])
    bisector.replays += 1
    out = right.replay(ev_g.meta)
    return experiment, bisector.outputs_match(graph, ev_g, out_r, out[0] if out else None)


def _captured_now(graph, ev_g, snaps, executor, wanted):
    """A graph of the dispatched phase's forward captured at the dispatched shape on the live metadata."""
    d = ev_g.dispatch
    fn = forward_fn(graph, ev_g.owner, wanted.phase)
    restore(snaps["graph"])
    try:
        return capture(executor.backend, executor.backend.new_pool("bisect"),
                       lambda: fn(d.num_tokens_padded, d.num_reqs_padded, ev_g.meta),
                       piecewise=wanted.runtime_mode == PIECEWISE, weak_outputs=False)
    except (RuntimeError, IndexError, ValueError):    # the forward cannot be captured here: no experiment
        return None
    finally:
        restore(snaps["graph"])
