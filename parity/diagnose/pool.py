"""POOL_ALIAS: target logits that matched the reference after the verify forward changed before the step's end.

Only another graph's replay can write there, so the drafter replay during
which they changed is replayed once more, alone, on logits restored to the
reference's values: if it overwrites them again, its temporaries share memory
with the target's output (POOL_ALIAS, that replay the experiment). If no
drafter replay was seen in between, or replaying it alone leaves the logits
alone, nothing isolated the cause: UNEXPLAINED, saying what was tried.
"""

from __future__ import annotations

from parity.diagnosis.kinds import POOL_ALIAS, UNEXPLAINED
from parity.audit.pool import overwrites_again
from parity.diagnose.state import state_tensors
from parity.graphs.tp_agree import agree_any


def diagnose(bisector, graph, verify_event, overwritten_by, drift: float, logits_r):
    evidence = ["target logits matched the padded reference after the verify forward, then changed before "
                f"the step's end (max |Δ| {drift:.3g})"]
    where = dict(max_abs_diff=drift, evidence=evidence)
    if overwritten_by is None:
        evidence.append("no drafter replay was seen while they changed")
        return bisector.diagnosis(UNEXPLAINED, [], verify_event, **where)
    d = overwritten_by.dispatch
    evidence.append(f"they changed during the {d.phase} replay (draft step {overwritten_by.draft_step}, "
                    f"{d.runtime_mode} graph of {d.num_tokens_padded} tokens)")
    experiment = (f"restore the target logits to the reference's values and replay that {d.phase} "
                  f"{d.runtime_mode} graph of {d.num_tokens_padded} tokens alone")
    if _overwrites_again(bisector, graph, verify_event, overwritten_by, logits_r):
        evidence.append("replaying that drafter graph alone overwrites the restored target logits: "
                        "its temporaries share memory with the target's output")
        return bisector.diagnosis(POOL_ALIAS, ["logits"], verify_event, experiment=experiment, **where)
    return bisector.diagnosis(UNEXPLAINED, [], verify_event, ruled_out=[f"{experiment}: the logits stay as restored"],
                              **where)


def _overwrites_again(bisector, graph, verify_event, suspect_event, logits_r) -> bool:
    d = suspect_event.dispatch
    entry = graph.owner(suspect_event.owner).executor.graphs.get((d.phase, d.runtime_mode, d.descriptor))
    if entry is None:
        return False
    logits = verify_event.logits[: verify_event.dispatch.num_tokens]
    bisector.replays += 1
    changed = overwrites_again([logits], [logits_r.to(logits.dtype)], lambda: entry.graph.replay(suspect_event.meta),
                               state_tensors(graph))
    return agree_any("pool: the drafter replay overwrites the logits", changed)
