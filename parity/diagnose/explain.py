"""The diagnosis for repairs that restored bitwise parity: the most specific kind, and what else was tried."""

from __future__ import annotations

from parity.diagnose.experiments import SPECIFICITY


def explain(bisector, ev_g, culprits, others, tried, **where):
    """Kind of the most specific culprit, every culprit's role, the experiment, what was ruled out."""
    culprits = sorted(culprits, key=lambda r: SPECIFICITY.index(r.kind))
    kind = culprits[0].kind
    names = sorted({r.name for r in culprits})
    first = culprits[0]
    evidence = []
    for r in culprits:
        line = f"{r.kind.lower()}: {r.name} ({r.holder})"
        if r.captured is not None and r.live is not None and r.captured != r.live:
            line += f", captured {r.captured:#x}, live {r.live:#x}"
        evidence.append(line + (f": {r.note}" if r.note else ""))
    if kind == "CAPTURE_CONTEXT":
        experiment = f"redirect every read of the capture-time metadata ({', '.join(names)}) to the live metadata"
    else:
        experiment = "; ".join(r.experiment for r in culprits) + (
            " (together: no single repair restores parity)" if len(culprits) > 1 else "")
    evidence.append(f"{experiment}: replaying restores bitwise parity with the padded reference")
    also = [f"{r.experiment} also restores parity ({r.kind}, less specific)" for r in others]
    chosen = {id(r) for r in culprits} | {id(r) for r in others}
    ruled_out = [r.experiment for r in tried if id(r) not in chosen]
    return bisector.diagnosis(kind, names, ev_g, captured=first.captured, live=first.live, evidence=evidence,
                              experiment=experiment, ruled_out=ruled_out, also=also, **where)
