"""DESCRIPTOR_MISMATCH: the forward replayed a graph captured for another batch shape.

A batch is built (metadata, padding) for the dispatcher's padded shape; the
graph it replays must have been captured for exactly that descriptor. When
the replayed graph's capture shape differs, the one-variable experiment
replays the graph captured for the dispatched descriptor instead, on the same
state: bitwise parity restored names the lookup.
"""

from __future__ import annotations

from parity.analysis.kinds import DESCRIPTOR_MISMATCH
from parity.diagnose.state import restore


def mismatched(executor, dispatch, entry) -> bool:
    return (entry.num_tokens, entry.num_reqs) != (dispatch.num_tokens_padded, dispatch.num_reqs_padded)


def diagnose(bisector, graph, ev_g, snaps, out_r, executor, entry, **where):
    """The diagnosis when replaying the graph of the dispatched descriptor restores parity, else None."""
    d = ev_g.dispatch
    right = executor.graphs.get((d.phase, d.runtime_mode, d.descriptor))
    replayed = f"{entry.num_tokens} tokens x {entry.num_reqs} rows"
    built = f"{d.num_tokens_padded} tokens x {d.num_reqs_padded} rows"
    if right is entry:
        # The dispatcher's own descriptor names a graph of another shape than the batch it padded.
        evidence = [f"the batch was padded to {built}, but its descriptor names the graph captured for {replayed}: "
                    "rows beyond the batch are read from whatever the buffers held"]
        return bisector.diagnosis(DESCRIPTOR_MISMATCH, ["descriptor"], ev_g, evidence=evidence,
                                  experiment="compare the batch's padded shape with its graph's capture shape",
                                  **where)
    if right is None:
        return None
    restore(snaps["graph"])
    bisector.replays += 1
    out = right.graph.replay(ev_g.meta)
    if not bisector.outputs_match(graph, ev_g, out_r, out[0] if out else None):
        return None
    experiment = f"replay the graph captured for the dispatched descriptor ({built}) instead of the one looked up"
    evidence = [f"the batch ({d.num_tokens} real tokens, {d.num_reqs} real rows) was built for the descriptor "
                f"{built}, but replayed the graph captured for {replayed}",
                f"{experiment}: bitwise parity with the padded reference restored"]
    return bisector.diagnosis(DESCRIPTOR_MISMATCH, ["descriptor"], ev_g, evidence=evidence, experiment=experiment,
                              **where)
