"""BUFFER_REASSIGNED found the other way round: when no repair of the graph restores parity.

Two stages, each a one-variable experiment:

- `piecewise_outputs`: a PIECEWISE graph has holders of its own: each eager
  attention call's output, which the next piece reads at the address it had at
  capture. When a call's output no longer is that tensor after a replay, the
  pieces are replayed once more delivering every attention result into the
  captured output: if that restores parity, the output was rebound
  (BUFFER_REASSIGNED attention_output, who: the piecewise replay).
- `pointed_back`: a role the reference reads through the metadata object at a
  tensor the persistent buffer does not share, while the graph read the
  persistent buffer, is pointed back at that buffer in a re-run of the
  reference. If the reference then produces the graph's outputs bit for bit,
  that one rebinding is the difference: BUFFER_REASSIGNED (who: metadata
  object). This covers a role read through two holders (RoPE from the
  registry, attention from the metadata), where copying values into the
  captured buffer would also change the reads that were right.
"""

from __future__ import annotations

import dataclasses

import torch

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.diagnosis.record import Diagnosis
from parity.audit import ranks
from parity.diagnose.lab import Divergence
from parity.diagnose.state import max_diff, outputs, registry_of
from parity.graphs.tp_agree import agree_all, agree_any


def piecewise_outputs(lab: Divergence) -> Diagnosis | None:
    """BUFFER_REASSIGNED(attention_output) when a PIECEWISE graph's attention outputs were rebound and
    delivering them into the captured tensors restores bitwise parity; None otherwise."""
    g = lab.entry.graph
    moved = [i for i, call in enumerate(getattr(g, "calls", ()))
             if call.static is not None and call.out is not call.static]
    if not agree_any("piecewise outputs: rebound", bool(moved)):     # every rank replays, if one has any
        return None
    lab.restore()
    lab.replays += 1
    for i, segment in enumerate(g.segments):
        segment.replay()
        if i < len(g.calls):
            call = g.calls[i]
            call.static.copy_(call.attend(lab.ev_g.meta))
    if not lab.matches(g.outputs):
        return None
    return ranks.shared("piecewise outputs: diagnosis", _delivered(lab, g, moved) if moved else None)


def _delivered(lab: Divergence, g, moved: list[int]) -> Diagnosis:
    call = g.calls[moved[0]]
    experiment = ("replay the pieces delivering every attention result into the output tensor the next piece "
                  "captured: replaying restores bitwise parity with the padded reference")
    evidence = [f"buffer_reassigned: attention_output (piecewise replay), captured {call.static.data_ptr():#x}, "
                f"live {call.out.data_ptr():#x}: {len(moved)} of {len(g.calls)} attention calls hold a new output "
                "tensor after the replay; the next piece reads the captured one", experiment]
    return lab.diagnosis(BUFFER_REASSIGNED, ["attention_output"], captured=call.static.data_ptr(),
                         live=call.out.data_ptr(), evidence=evidence, experiment=experiment,
                         ruled_out=list(lab.ruled_out))


def split_roles(lab: Divergence) -> list[str]:
    """Roles the reference reads through the metadata object at a tensor its persistent buffer does not share,
    where the graph read the persistent buffer."""
    registry = registry_of(lab.ref, lab.ev_r.owner)
    from_registry = {e.name for e in lab.entry.manifest if e.holder == "registry"}
    return [name for name, holders in sorted((lab.reads or {}).items())
            if "metadata object" in holders and name in registry and name in from_registry
            and isinstance(getattr(lab.ev_g.meta, name, None), torch.Tensor)]


def pointed_back(lab: Divergence) -> Diagnosis | None:
    """BUFFER_REASSIGNED of the first role whose metadata tensor, pointed back at the persistent buffer in a
    re-run of the reference, makes it produce the graph's outputs bit for bit; None (ruled out) otherwise.
    Under TP every rank's roles are tried, a plain re-run on a rank without the role (`ranks.candidates`)."""
    ev_r = lab.ev_r
    registry, fn, d = registry_of(lab.ref, ev_r.owner), lab.forward("ref"), ev_r.dispatch
    found = ranks.candidates("pointed back: roles", {name: name for name in split_roles(lab)}, lambda name: None)
    for candidate in found:
        name, meta = candidate.key, _pointed_back(ev_r.meta, registry, candidate.local)
        if not agree_any("pointed back: the buffer fits", meta is not None):
            continue
        lab.restore("ref")
        lab.replays += 1
        out = outputs(lab.ref, ev_r, fn(d.num_tokens_padded, d.num_reqs_padded, meta or ev_r.meta))
        lab.restore("ref")
        if agree_all("pointed back: the reference produces the graph's outputs", max_diff(out, lab.out_g)[0] == 0):
            return ranks.shared("pointed back: diagnosis", _rebound(lab, name) if meta is not None else None)
    lab.ruled_out += [f"point the reference's metadata {c.key} back at the persistent buffer" for c in found]
    return None


def _pointed_back(meta, registry, name: str | None):
    """The reference's metadata with `name` pointed back at its persistent buffer; None when it cannot be."""
    if name is None:
        return None
    field, buffer = getattr(meta, name), registry[name]
    if buffer.dim() != field.dim() or buffer.shape[0] < field.shape[0] or buffer.shape[1:] != field.shape[1:]:
        return None
    return dataclasses.replace(meta, **{name: buffer[: field.shape[0]]})


def _rebound(lab: Divergence, name: str) -> Diagnosis:
    captured = next(e.address for e in lab.entry.manifest if e.name == name and e.holder == "registry")
    live = getattr(lab.ev_g.meta, name).data_ptr()
    experiment = (f"re-run the reference with the metadata's {name} pointed back at the persistent buffer "
                  "the graph captured: it produces the graph's outputs bit for bit")
    evidence = [f"buffer_reassigned: {name} (metadata object), captured {captured:#x}, live {live:#x}: "
                "the metadata object rebound it to a fresh tensor; the persistent buffer the graph reads "
                "kept its old values", experiment]
    return lab.diagnosis(BUFFER_REASSIGNED, [name], captured=captured, live=live, evidence=evidence,
                         experiment=experiment, ruled_out=list(lab.ruled_out))
