"""From "this replay differs from eager" to the one change that restores bitwise parity.

Runs the experiments of `experiments.py` and `recaptures.py` and picks the
diagnosis: the most specific experiment that restores parity (a single buffer
copied, then a single host value re-captured); when several do, the others are named in
`also`; then all copies together; then the control re-capture
(CAPTURE_CONTEXT); when none restores parity, UNEXPLAINED with everything
that was ruled out.
"""

from __future__ import annotations

import time

from parity.audit.cheap import Rebind
from parity.audit.lab import ShadowLab
from parity.audit.experiments import Experiment, copy_experiment, copy_repairs, group_copy_experiment
from parity.audit.recaptures import host_experiments
from parity.audit.state import Mismatch


def _copies(lab: ShadowLab, rebinds: list[Rebind]) -> tuple[list[Experiment], list[str]]:
    lab.pre.restore()
    repairs, notes = copy_repairs(rebinds)
    return [copy_experiment(lab, repair) for repair in repairs], notes


def run_experiments(lab: ShadowLab, rebinds: list[Rebind]) -> tuple[Experiment | None, list[Experiment], list[str]]:
    """(the diagnosis experiment or None, every experiment run, notes)."""
    copies, notes = _copies(lab, rebinds)
    control, singles = host_experiments(lab, lab.host_values())
    run = copies + singles
    restoring = [e for e in run if e.restores]
    if restoring:
        best = restoring[0]
        if control.restores:
            best.evidence.append("a re-capture with every host value as captured restores parity too, as it "
                                 "must when the graph reads a tensor the live objects no longer hold")
        return best, run + [control], notes
    group = group_copy_experiment(lab, rebinds)
    if group is not None:
        run.append(group)
        if group.restores:
            return group, run + [control], notes
    run.append(control)
    if control.restores:
        moved = sorted({r.role.name for r in rebinds})
        control.evidence = ["a fresh capture with every host value as captured restores parity, and no single "
                            "buffer copy or host value does: the graph baked capture-time state it does not "
                            "re-read (metadata tensors it was captured with, a builder's state)"]
        if moved:
            control.evidence.append("roles that reach other tensors than at capture: " + ", ".join(moved))
            control.buffers = moved
        return control, run, notes
    return None, run, notes


def localise(lab: ShadowLab, mismatch: Mismatch, rebinds: list[Rebind], started: float) -> dict:
    """The diagnosis dict of a replay that differs from its eager shadow run."""
    began = time.perf_counter()
    best, run, notes = run_experiments(lab, rebinds)
    ruled_out = [e.description for e in run if e is not best and not e.restores]
    # Other single experiments that restore parity too, less specific than the first (the order tried).
    also = [e.description for e in run if e is not best and e.restores]
    evidence = [f"replay {lab.audit.replays}: {mismatch.describe()} between the graph and the callable run eagerly "
                "on the same live inputs"]
    if best is None:
        kind, buffers, experiment = "UNEXPLAINED", [], None
        evidence.append(f"none of the {len(run)} one-variable experiments restores bitwise parity")
        if lab.record.unnamed:
            evidence.append(f"{len(lab.record.unnamed)} captured input(s) are reachable from no argument, "
                            "bound object or static input: name them with static_inputs={name: tensor}")
    else:
        kind, buffers, experiment = best.kind, best.buffers, best.description
        evidence += best.evidence
    evidence += notes
    timing = {"shadow_ms": round((began - started) * 1e3, 3),
              "experiments_ms": round((time.perf_counter() - began) * 1e3, 3)}
    return lab.audit._diagnosis(kind, buffers, rows=mismatch.rows, max_abs_diff=mismatch.max_abs_diff,
                                captured_address=best.captured_address if best else None,
                                live_address=best.live_address if best else None, evidence=evidence,
                                replays=lab.replays, timing=timing, experiment=experiment, ruled_out=ruled_out,
                                also=also)
