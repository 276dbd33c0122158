"""OUTPUT_ALIASED: every forward matched, yet the records differ: an output was read after a replay overwrote it.

The lockstep compares each forward's outputs as the forward ends. A run whose
forwards all match the reference bit for bit, but whose records (tokens,
logprobs, drafts) still differ, read some output later than that. A graph's
outputs live in memory that its next replay (or the replay of a graph sharing
its pool) writes again; an engine that holds them by reference instead of
copying them out reads the later values. Eager forwards return fresh tensors
every time, so the same engine is right in eager and in the reference.

The experiment changes one thing, the outputs' lifetime: the graph run is
repeated with one forward output at a time handed out as a copy right after
every replay (`CapturePolicy.copied_outputs`). The output whose copy restores
bitwise parity of the records with the reference is named. When none does,
there is no diagnosis yet (NONE, carrying the first record that differs and
every copy tried) and the padding stage goes on.
"""

from __future__ import annotations

from parity.diagnosis.kinds import NONE, OUTPUT_ALIASED
from parity.analysis.reference_parity import describe, reference_parity
from parity.engine.spec_decode import ForwardEvent
from parity.graphs.tp_agree import agree_all


def records_differ(ref_result, graph_result):
    """The records' first difference when the two runs' records are not bit for bit equal (else None)."""
    parity = reference_parity(graph_result, ref_result, "reference")
    return None if parity.bitwise_equal else parity.first_difference


def diagnose(bisector, owners, ref_result, first: dict):
    """`owners`: the graph engine's, whose forwards name their outputs."""
    outputs = [(owner.name, forward.phase, name) for owner in owners for forward in owner.forwards()
               for name in forward.outputs]
    evidence = [f"every forward's outputs matched the reference bit for bit as the forward ended, yet the records "
                f"differ: {describe(first)}"]
    tried = []
    for owner, phase, name in outputs:
        engine = bisector.make_engine()
        bisector.install_graph(engine, copied=(name,))
        bisector.replays += 1
        again = engine.run(bisector.specs)
        del engine
        experiment = f"re-run with the {owner}'s {name} copied out of graph memory after every {phase} replay"
        if agree_all("lifetime: the records are the reference's", records_differ(ref_result, again) is None):
            evidence += [f"{experiment}: the records are bit for bit equal to the reference's",
                         f"{name} was read after a later replay had overwritten it: it must be copied (or read) "
                         "before the next replay"]
            event = ForwardEvent("post", first["step"], -1, phase, None, owner=owner)
            return bisector.diagnosis(OUTPUT_ALIASED, [name], event, evidence=evidence, experiment=experiment,
                                      ruled_out=tried)
        tried.append(experiment)
    event = ForwardEvent("post", first["step"], -1, None, None)
    evidence.append("no single output copied out of graph memory restores parity")
    return bisector.diagnosis(NONE, [], event, evidence=evidence, ruled_out=tried)
