"""BUFFER_REASSIGNED of a PIECEWISE graph's own holders: attention outputs rebound after capture.

A PIECEWISE graph has holders of its own: each eager attention call's output,
which the next piece reads at the address it had at capture. When a call's
output no longer is that tensor after a replay, the pieces are replayed once
more delivering every attention result into the captured output
(`piecewise_outputs`): if that restores parity, the output was rebound
(BUFFER_REASSIGNED attention_output, who: the piecewise replay). Run after the
repairs, when no repair of the graph restores parity; a metadata role read
through two holders is `audit/handed.py`'s `pointed_back`.
"""

from __future__ import annotations

from parity.diagnosis.kinds import BUFFER_REASSIGNED
from parity.diagnosis.record import Diagnosis
from parity.audit import ranks
from parity.diagnose.lab import Divergence
from parity.graphs.tp_agree import agree_any


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
