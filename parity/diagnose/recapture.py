"""FROZEN_AT_CAPTURE: re-capture with the same tensors and one host value changed, and replay.

A graph bakes in the Python values its forward used at capture (a draft step
index, a window start, a row count). Each experiment re-captures the forward
from the capture-time metadata object (so the graph reads the very same
addresses) with exactly one host value set to its live value, and replays it
on the live metadata. A control re-capture with every host value as captured
must not restore parity: if it does, the original capture, not a baked value,
is at fault. When no single value restores parity but all of them together
do, delta debugging finds the smallest set.

A value can also be baked from a tensor: a forward that reads a buffer to the
host while capturing (`.tolist()`, `.item()`) replays what the buffer held at
capture. When a fresh capture from the live state restores parity, each
integer buffer whose capture-time contents (recorded by the graph manager)
differ from the live ones is put back, alone, to those contents before a
re-capture (after a control with all of them put back brings the divergence
back): the one that brings it back alone is FROZEN_AT_CAPTURE.
Otherwise UNEXPLAINED, with everything that was ruled out and the layer
probes' localisation.
"""

from __future__ import annotations

import dataclasses

import torch

from parity.diagnosis.kinds import FROZEN_AT_CAPTURE, UNEXPLAINED
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
    registries = {(r.owner, name): t for r in executor.registries for name, t in r.items()}

    def recaptured_matches(live: dict, contents=()) -> bool:
        """Re-capture from the live state with host values `live` changed and the buffers `contents` set to
        what the original capture saw; replay on the live state."""
        try:
            return _recaptured_matches(live, contents)
        except (RuntimeError, IndexError, ValueError) as exc:   # the forward cannot run on these values
            ruled.append(f"re-capture with {sorted(live) or 'the captured values'} failed: {str(exc)[:80]}")
            return False

    def _recaptured_matches(live: dict, contents) -> bool:
        meta = dataclasses.replace(entry.capture_meta, **live)
        restore(snaps["graph"])
        for key in contents:
            registries[key].copy_(entry.captured_contents[key])
        g = capture(executor.backend, executor.backend.new_pool("bisect"),
                    lambda: fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta),
                    piecewise=dispatch.runtime_mode == "piecewise", weak_outputs=False)
        restore(snaps["graph"])
        bisector.replays += 1
        out = g.replay(live_meta)
        return bisector.outputs_match(graph, ev_g, out_r, out)

    ruled = list(ruled_out)
    if recaptured_matches({}):
        restore(snaps["graph"])
        moved = sorted(k for k, t in entry.captured_contents.items() if k in registries
                       and registries[k].shape == t.shape and not torch.equal(registries[k].cpu(), t))
        if moved and not recaptured_matches({}, moved):
            baked = [k for k in moved if not recaptured_matches({}, [k])]
            if baked:
                return _baked(bisector, ev_g, [k[1] for k in baked], moved, ruled, **where)
        ruled.append("a fresh capture from the live state restores parity, yet no host value and no buffer's "
                     "capture-time contents alone bring the divergence back: the original capture differs")
    elif differing:
        frozen = [k for k in differing if recaptured_matches({k: live_fields[k]})]
        if not frozen and len(differing) > 1 and recaptured_matches({k: live_fields[k] for k in differing}):
            frozen = ddmin(differing, lambda s: recaptured_matches({k: live_fields[k] for k in s}))
        if frozen:
            return _frozen(bisector, ev_g, frozen, captured, live_fields, ruled, **where)
        ruled.append("re-capture with the live value of " + ", ".join(differing))
    else:
        ruled.append("a fresh capture from the live state does not restore parity, and no host value differs "
                     "from the capture's")
    evidence = ["no one-variable experiment restores bitwise parity", *probe_layers(bisector, ref, graph, ev_r,
                                                                                    ev_g, snaps)]
    return bisector.diagnosis(UNEXPLAINED, [], ev_g, evidence=evidence, ruled_out=ruled, **where)


def _baked(bisector, ev_g, names, moved, ruled, **where):
    """Buffers whose contents the forward read to the host while capturing (a `.tolist()`, an `.item()`)."""
    evidence = [f"{', '.join(names)}: the contents the original capture saw differ from the live ones",
                f"a re-capture from the live state restores bitwise parity; with {', '.join(names)} put back to "
                "its capture-time contents (and nothing else) the divergence returns: the forward read it to "
                "the host while capturing, and the graph replays those values"]
    experiment = (f"re-capture from the live state with only {', '.join(names)} at its capture-time contents "
                  "(same addresses, same host values)")
    others = sorted({k[1] for k in moved} - set(names))
    if others:
        ruled = ruled + [f"the capture-time contents of {', '.join(others)}"]
    return bisector.diagnosis(FROZEN_AT_CAPTURE, names, ev_g, evidence=evidence, experiment=experiment,
                              ruled_out=ruled, **where)


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
