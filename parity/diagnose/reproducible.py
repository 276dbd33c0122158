"""The control every experiment needs: does the forward give the same bits again from its own pre-state?

An experiment restores a forward's pre-state, changes one thing, re-runs it and
compares bit for bit with the reference. That means something only when the
unchanged forward reproduces its own outputs. On CUDA it need not: when several
tokens of one forward write the same KV slot (padded tokens whose PAD slot is
mapped onto a real one), one `index_copy_` leaves the slot to whichever write
lands last, and the winner can change from launch to launch. Every experiment
on such a forward is a coin flip, and the first one that happens to match
would name a cause it did not isolate.

So before any experiment two observations are made:

1. the real KV slots the padded tokens of the reference write
   (`padding.padded_writes`, as the padding stage observes them first: a
   write set, which a race cannot hide). Any such slot breaks the padding
   contract on its own, and it is where a race would sit:
   PADDING_LEAK(slot_mapping), without a one-variable experiment.
   Two re-runs that happen to agree do not make such a forward safe to
   experiment on: a later experiment's re-run can lose the race and "restore
   parity", naming a cause it did not isolate. The same holds for every
   indexed write, not only the KV store: one whose padded rows target an
   element a live row targets (a recurrent state slot, any row of a persistent
   tensor) is PADDING_LEAK naming the buffer that supplied its indices
   (`routing.overwrite_diagnosis`), told from the indices alone.
2. otherwise the divergent forward is re-run from its pre-state, twice in the
   reference and twice in the graph run; when either does not reproduce its
   outputs, the diagnosis is UNEXPLAINED, saying so and which first-layer KV
   rows moved (a real token's first-layer key and value depend on its own
   inputs alone).
"""

from __future__ import annotations

from parity.diagnosis.kinds import PADDING_LEAK, UNEXPLAINED
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.diagnose.padding import padded_writes, slot_list
from parity.diagnose.state import max_diff
from parity.audit.state import rows_apart
from parity.graphs.tp_agree import merged_lines

RERUNS = 2


def unstable(lab: Divergence, run: str) -> tuple[float, set[int]]:
    """Re-runs of the forward of `run` ("ref" or "graph") from its pre-state against what it produced: the
    largest difference (0.0: reproducible) and the first-layer KV rows that moved."""
    engine, event = lab.side(run)
    expected = lab.out_r if run == "ref" else lab.out_g
    layers = len(engine.owner(event.owner).kv_cache.keys)
    first_layer = ("kv0", f"kv{layers}")
    worst, raced = 0.0, set()
    for _ in range(RERUNS):
        again = lab.run(side=run)
        worst = max(worst, max_diff(expected, again)[0])
        for name in first_layer:
            raced |= set(rows_apart(expected[name], again[name]))
    lab.restore(run)
    return worst, raced


def stage(lab: Divergence) -> Diagnosis | None:
    """PADDING_LEAK when the reference's padded tokens write real KV slots at the divergent forward, or padded
    rows of any indexed write target what a live row targets; else None when both runs reproduce it; else
    UNEXPLAINED, saying that they do not."""
    stray, overwritten = padded_writes(lab, "reproducible")
    if overwritten is not None:
        return overwritten
    runs = {"reference": unstable(lab, "ref"), "graph run": unstable(lab, "graph")}
    raced = set().union(*(rows for _, rows in runs.values()))
    evidence = [f"the {run}'s forward does not reproduce its own outputs from its pre-state ({RERUNS} re-runs, "
                f"max |Δ| {delta:.3g}): it is not deterministic" for run, (delta, _) in runs.items() if delta]
    if raced:
        evidence.append(f"first-layer KV rows that differ between re-runs: slots {slot_list(raced)}")
    evidence = merged_lines("reproducible: re-runs", evidence)
    if stray:
        evidence.append(f"the padded reference's padded tokens write the KV cache of real requests: slots "
                        f"{slot_list(stray)}")
        evidence.append("several tokens writing one slot in one kernel race on CUDA (which write lands last is "
                        "not fixed), so no one-variable experiment is run on this forward")
        return lab.diagnosis(PADDING_LEAK, ["slot_mapping"], evidence=evidence, ruled_out=[],
                             experiment="re-run the forward from its pre-state, plain and with only its padded "
                                        "tokens' inputs poisoned: the KV rows its padded tokens write, less the "
                                        "rows its real tokens own")
    if not evidence:
        return None
    evidence.append("every one-variable experiment compares re-runs bit for bit; on a forward that is not "
                    "reproducible none can isolate a cause")
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence,
                         ruled_out=["a race between padded and real KV writes (no real slot is written by a "
                                    "padded token)"])
