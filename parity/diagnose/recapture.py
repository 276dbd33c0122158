"""FROZEN_AT_CAPTURE: re-capture with the same tensors and one host value changed, and replay.

A graph bakes in the Python values its forward used at capture (a draft step
index, a window start, a row count). Each experiment re-captures the forward
from the capture-time metadata object (so the graph reads the very same
addresses) with exactly one host value set to its live value, and replays it
on the live metadata. A control re-capture with every host value as captured
must not restore parity: if it does, the original capture, not a baked value,
is at fault. When no single value restores parity but all of them together
do, delta debugging finds the smallest set. Otherwise UNEXPLAINED, with
everything that was ruled out and the layer probes' localisation.
"""

from __future__ import annotations

import dataclasses

from parity.analysis.kinds import FROZEN_AT_CAPTURE, UNEXPLAINED
from parity.diagnose.delta_debug import ddmin
from parity.diagnose.probes import probe_layers
from parity.diagnose.state import forward_fn, restore
from parity.graphs.capture import capture
from parity.graphs.manager import python_fields


def diagnose(bisector, ref, graph, ev_r, ev_g, snaps, out_r, entry, executor, ruled_out: list[str], **where):
    dispatch, live_meta = ev_g.dispatch, ev_g.meta
    live_fields = python_fields(live_meta)
    captured = entry.captured_with
    differing = sorted(k for k in live_fields if captured.get(k) != live_fields[k])
    fn = forward_fn(graph, ev_g.owner, ev_g.phase)

    def recaptured_matches(live: dict) -> bool:
        try:
            return _recaptured_matches(live)
        except (RuntimeError, IndexError, ValueError) as exc:   # the forward cannot run on these values
            ruled.append(f"re-capture with {sorted(live) or 'the captured values'} failed: {str(exc)[:80]}")
            return False

    def _recaptured_matches(live: dict) -> bool:
        meta = dataclasses.replace(entry.capture_meta, **live)
        restore(snaps["graph"])
        g = capture(executor.backend, executor.backend.new_pool("bisect"),
                    lambda: fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta),
                    piecewise=dispatch.runtime_mode == "piecewise", weak_outputs=False)
        restore(snaps["graph"])
        bisector.replays += 1
        out = g.replay(live_meta)
        return bisector.outputs_match(graph, ev_g, out_r, out[0] if out else None)

    ruled = list(ruled_out)
    if differing:
        if recaptured_matches({}):
            ruled.append("a fresh capture with every host value as captured already restores parity: "
                         "the original capture, not a baked value, differs")
        else:
            frozen = [k for k in differing if recaptured_matches({k: live_fields[k]})]
            if not frozen and len(differing) > 1 and recaptured_matches({k: live_fields[k] for k in differing}):
                frozen = ddmin(differing, lambda s: recaptured_matches({k: live_fields[k] for k in s}))
            if frozen:
                return _frozen(bisector, ev_g, frozen, captured, live_fields, ruled, **where)
            ruled.append("re-capture with the live value of " + ", ".join(differing))
    evidence = ["no one-variable experiment restores bitwise parity", *probe_layers(bisector, ref, graph, ev_r,
                                                                                    ev_g, snaps)]
    return bisector.diagnosis(UNEXPLAINED, [], ev_g, evidence=evidence, ruled_out=ruled, **where)


def _frozen(bisector, ev_g, frozen, captured, live_fields, ruled, **where):
    evidence = [f"{k}: captured {_short(captured.get(k))}, live {_short(live_fields[k])}" for k in frozen]
    evidence.append(f"re-capturing with the same tensors and only the live {', '.join(frozen)} restores bitwise "
                    "parity; the control re-capture with the captured values does not")
    experiment = f"re-capture with the live {', '.join(frozen)} (same addresses, one host value changed)"
    return bisector.diagnosis(FROZEN_AT_CAPTURE, frozen, ev_g, evidence=evidence, experiment=experiment,
                              ruled_out=ruled, **where)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
