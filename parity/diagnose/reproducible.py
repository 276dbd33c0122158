"""The control every experiment needs: does the forward give the same bits again from its own pre-state?

An experiment restores a forward's pre-state, changes one thing, re-runs it and
compares bit for bit with the reference. That means something only when the
unchanged forward reproduces its own outputs. On CUDA it need not: when several
tokens of one forward write the same KV slot (padded tokens whose PAD slot is
mapped onto a real one), one `index_copy_` leaves the slot to whichever write
lands last, and the winner can change from launch to launch. Every experiment
on such a forward is a coin flip, and the first one that happens to match
would name a cause it did not isolate.

So before any experiment the divergent forward is re-run from its pre-state,
twice in the reference and twice in the graph run. When either does not
reproduce its outputs, no one-variable experiment is run. Two observations
decide what is said instead:

1. the first-layer KV rows that differ between the re-runs (a real token's
   first-layer key and value depend on its own inputs alone, so a row that
   moves there was raced for);
2. the real KV slots the padded tokens write (`padding.padded_kv_writes`: a
   write set, which a race cannot hide).

When the raced rows are all slots the padded tokens write, the race is theirs:
PADDING_LEAK(slot_mapping). Otherwise UNEXPLAINED, saying the forward is not
reproducible and what was seen.
"""

from __future__ import annotations

from parity.diagnosis.kinds import PADDING_LEAK, UNEXPLAINED
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose.padding import padded_kv_writes
from parity.diagnose.state import max_diff

RERUNS = 2


def unstable(lab: Divergence, run: str) -> tuple[float, set[int]]:
    """Re-runs of the forward of `run` ("ref" or "graph") from its pre-state against what it produced: the
    largest difference (0.0: reproducible) and the first-layer KV rows that moved."""
    engine, event = (lab.ref, lab.ev_r) if run == "ref" else (lab.graph, lab.ev_g)
    expected = lab.out_r if run == "ref" else lab.out_g
    layers = len(engine.owner(event.owner).kv_cache.keys)
    first_layer = ("kv0", f"kv{layers}")
    worst, raced = 0.0, set()
    for _ in range(RERUNS):
        lab.restore(run)
        again = lab.rerun(run)
        worst = max(worst, max_diff(expected, again)[0])
        for name in first_layer:
            moved = (expected[name] != again[name]).reshape(expected[name].shape[0], -1).any(dim=1)
            raced |= set(moved.nonzero().flatten().tolist())
    lab.restore(run)
    return worst, raced


def stage(lab: Divergence) -> Diagnosis | None:
    """None when both runs reproduce the divergent forward; otherwise the diagnosis that says they do not."""
    runs = {"reference": unstable(lab, "ref"), "graph run": unstable(lab, "graph")}
    if not any(delta for delta, _ in runs.values()):
        return None
    raced = set().union(*(rows for _, rows in runs.values()))
    evidence = [f"the {run}'s forward does not reproduce its own outputs from its pre-state ({RERUNS} re-runs, "
                f"max |Δ| {delta:.3g}): it is not deterministic" for run, (delta, _) in runs.items() if delta]
    if raced:
        evidence.append(f"first-layer KV rows that differ between re-runs: slots {_slots(raced)}")
    stray = set(padded_kv_writes(lab, "ref"))
    if stray:
        evidence.append(f"padded tokens write the KV cache of real requests: slots {_slots(stray)}")
    if raced and raced <= stray:
        evidence.append("the rows that differ between re-runs are slots padded tokens write: several tokens write "
                        "one slot in one kernel, and which write lands last is not fixed")
        return lab.diagnosis(PADDING_LEAK, ["slot_mapping"], evidence=evidence, ruled_out=[],
                             experiment="re-run the forward from its pre-state: the first-layer KV rows that "
                                        "differ between re-runs, against the slots its padded tokens write")
    evidence.append("every one-variable experiment compares re-runs bit for bit; on a forward that is not "
                    "reproducible none can isolate a cause")
    ruled_out = ["a race between padded and real KV writes" + (" (no real slot is written by a padded token)"
                                                               if not stray else " (other rows differ too)")]
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence, ruled_out=ruled_out)


def _slots(rows: set[int]) -> str:
    shown = sorted(rows)
    return ", ".join(str(s) for s in shown[:8]) + (f" (+{len(shown) - 8})" if len(shown) > 8 else "")
