"""What the padding checks conclude for a drifting mode, before (or instead of) a bisection.

The padding probe (`engine.padding_probe`) judges the padding contract under
two poisons and, on a leak, isolates a region; the fixed yardstick
(`analysis.yardstick`) judges how far a reference may part from eager. A
bisection localises a difference between a graph and its reference: when
there is none (the bug is shared) or when the reference's own poisoning is why
they differ, the answer comes from here.
"""

from __future__ import annotations

from parity.analysis.compare import describe_leak
from parity.diagnosis.kinds import NONE, PADDING_LEAK, PADDING_NUMERICS, UNEXPLAINED
from parity.diagnosis.record import Diagnosis
from parity.graphs.tp_agree import agree_same
from parity.harness.modes import run_reference

TWO_POISONS = "a FREE padded entry, a buffer tail or an unowned KV slot read by a live row (two poisons)"


def padding_diagnosis(pair, scenario, mode: str, device, request, cmp) -> dict | None:
    """The diagnosis of a drifting `mode` from the padding checks, or None (then the bisector localises it).

    - PADDING_LEAK from the padding probe, when its re-runs isolated a region
      and either the graph equals its reference bit for bit (a shared bug:
      nothing to bisect), or the region is one only the reference poisons (a
      tail, unowned KV slots: that poisoning is why the two differ), or the
      forward raced (it reproduced once the padded entries were repaired);
    - when nothing was isolated and the graph equals a reference that departs
      from eager beyond the fixed bound: `inert_read_diagnosis`.
    """
    leak = (cmp.padding_contract or {}).get("first")
    named = bool(leak and leak["buffers"])
    # NOTE: under TP the re-run holds collectives: ranks that would not all run it part here (RANK_DIVERGENCE).
    if agree_same("padding diagnosis: re-run moving inert entries", not named and shared_departure(cmp)):
        return inert_read_diagnosis(pair, scenario, mode, device, request, cmp)
    if not named:
        return None
    shared = cmp.reference is None or cmp.reference.bitwise_equal
    # A tail or unowned KV slot only the reference poisons explains a graph-vs-reference difference too; and a
    # forward padded tokens make irreproducible leaves a lockstep bisection nothing stable to localise.
    # Padded rows writing over live rows in one op (told from the indices) race on CUDA: nothing stable to bisect.
    probe_first = bool({"tail", "kv", "race", "overwrite"} & set(leak["kinds"]))
    if not shared and not probe_first:
        return None
    return leak_diagnosis(mode, leak, [])


def unless_unexplained(diagnosis: dict, cmp) -> dict:
    """The bisection's answer, unless it explained nothing and the padding probe isolated a region: then the
    probe's (a forward that padded tokens make irreproducible, racing live ones for a KV slot on CUDA, leaves
    the lockstep bisection nothing stable to localise)."""
    leak = ((cmp.padding_contract or {}).get("first") if cmp is not None else None) or {}
    if diagnosis["kind"] not in (UNEXPLAINED, NONE) or not leak.get("buffers"):
        return diagnosis
    found = leak_diagnosis(diagnosis["mode"], leak, [f"the bisection explained nothing ({diagnosis['kind']})"],
                           ruled_out=diagnosis.get("ruled_out") or ())
    found["timing"] = diagnosis.get("timing")
    return found


def shared_departure(cmp) -> bool:
    """The graph equals its reference bit for bit, and the reference departs from eager beyond the bound."""
    return (cmp.reference is not None and cmp.reference.bitwise_equal and cmp.numerics is not None
            and cmp.numerics.beyond_bound)


def inert_read_diagnosis(pair, scenario, mode: str, device, request, cmp) -> dict:
    """A shared departure the two poisons did not explain: re-run the reference, moving each INERT buffer's
    padded entries off their pad value at its probed forwards; a buffer whose move changes live outputs is
    read for a live row (PADDING_LEAK). Otherwise PADDING_NUMERICS, with what was ruled out."""
    n = cmp.numerics
    departs = (f"the graph equals its padded reference bit for bit; the reference departs from eager by max "
               f"|Δ logprob| {n.noise:.3g} on same-context records, beyond the bound {n.bound:.3g}")
    run = run_reference(pair, scenario, mode, cmp.reference.reference, device, request.parts, inert_reads=True)
    leak = next((leak for leak in (run.padding_probe or {}).get("leaks", []) if leak["buffers"]), None)
    if leak is not None:
        return leak_diagnosis(mode, leak, [departs], ruled_out=[TWO_POISONS])
    unnamed = (cmp.padding_contract or {}).get("first")
    evidence = [departs] + ([f"the padding probe saw live outputs change with the padding but isolated no "
                             f"region: {describe_leak(unnamed)}"] if unnamed else [])
    return Diagnosis(PADDING_NUMERICS, [], mode, evidence=evidence, timing={},
                     ruled_out=[TWO_POISONS, "an INERT padded entry read for a live row (each moved off its pad "
                                             "value)"]).as_dict()


def leak_diagnosis(mode: str, leak: dict, evidence: list[str], ruled_out=()) -> dict:
    """PADDING_LEAK naming what the probe isolated, where it first showed."""
    return Diagnosis(PADDING_LEAK, list(leak["buffers"]), mode, owner=leak["owner"], phase=leak["phase"],
                     step=leak["step"], draft_step=leak["draft_step"], forward_index=leak["forward"],
                     evidence=evidence + [f"the padded reference's {describe_leak(leak)}"] + list(leak["evidence"]),
                     experiment=leak["experiment"], ruled_out=list(ruled_out), timing={}).as_dict()
