"""From "this replay differs from eager" to the one change that restores bitwise parity.

The shared stages run on the replay's `ShadowLab` as the harness runs them on
its `Divergence`: `handed.stage` (a role handed at another layout of the
captured storage than the graph reads: the eager run given the captured layout
reproduces the replay), `repairs.stage` (the copies of the live values of moved
roles into what the graph read: all together, then each alone, the most
specific first, then the smallest set), `handed.pointed_back` (a role rebound
to a fresh tensor pointed back at the persistent buffer another role still
reads, where a copy would change both), then `recaptures.stage` (a re-capture
with one host value, or an input absent at capture, at its live value). When
the control re-capture, every host value as captured, restores parity, the
graph baked some other capture-time state (CAPTURE_CONTEXT); when nothing
restores parity, UNEXPLAINED with everything that was ruled out.
"""

from __future__ import annotations

import time

from parity.audit import handed, recaptures, repairs
from parity.audit.lab import ShadowLab
from parity.audit.state import Mismatch
from parity.diagnosis.kinds import CAPTURE_CONTEXT, UNEXPLAINED
from parity.diagnosis.record import Diagnosis


def _fresh(lab: ShadowLab) -> Diagnosis:
    """A fresh capture with every host value as captured restores parity, and no copy did."""
    evidence = ["a fresh capture with every host value as captured restores parity, and no buffer copy or host "
                "value does: the graph baked capture-time state it does not re-read (metadata tensors it was "
                "captured with, a builder's state)"]
    moved = sorted({r.role.name for r in lab.rebinds})
    if moved:
        evidence.append("roles that reach other tensors than at capture: " + ", ".join(moved))
    return lab.diagnosis(CAPTURE_CONTEXT, moved, evidence=evidence,
                         experiment=recaptures.CONTROL)


def _unexplained(lab: ShadowLab) -> Diagnosis:
    evidence = ["no one-variable experiment restores bitwise parity (each is ruled out below)"]
    if lab.record.unnamed:
        evidence.append(f"{len(lab.record.unnamed)} captured input(s) are reachable from no argument, bound object "
                        "or static input: name them with static_inputs={name: tensor}")
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence)


def localise(lab: ShadowLab, mismatch: Mismatch, started: float) -> dict:
    """The diagnosis dict of a replay that differs from its eager shadow run."""
    began = time.perf_counter()
    found = (handed.stage(lab) or repairs.stage(lab) or handed.pointed_back(lab)
             or recaptures.stage(lab, fresh=_fresh) or _unexplained(lab))
    found.evidence = [f"replay {lab.audit.replays}: {mismatch.describe()} between the graph and the callable run "
                      "eagerly on the same live inputs", *found.evidence]
    found.rows, found.max_abs_diff = list(mismatch.rows), mismatch.max_abs_diff
    found.timing = {"shadow_ms": round((began - started) * 1e3, 3),
                    "experiments_ms": round((time.perf_counter() - began) * 1e3, 3)}
    return found.as_dict()
