"""`--check-unpadded`: is eager itself right? Eager against the same requests run one at a time.

A padding bug that every mode shares, eager included, is not a graph bug: the
graph equals its reference, the reference agrees with eager, and the harness
would pass it. Plain eager batches requests but never pads; run alone, one
request per batch, a request's forwards have no other rows and no padding at
all. When eager departs from that unpadded single-request run beyond the
dtype's padding-numerics bound while the padded references agree with eager,
the engine is wrong in every mode: the user learns that in one line.
"""

from __future__ import annotations

import dataclasses

from parity.analysis.numerics import numerics
from parity.harness.modes import RunSet, run_mode
from parity.harness.scenario import Scenario


def check_unpadded(pair, scenario: Scenario, backend: str, device, parts, runs: RunSet) -> dict:
    """Eager (batched) against an eager run with max_num_seqs 1; the references against eager."""
    solo_scenario = dataclasses.replace(scenario, max_num_seqs=1)
    solo = run_mode(pair, solo_scenario, "eager", backend, device, parts)
    bound = runs.yardstick.bound
    eager = runs.runs["eager"].result
    apart = numerics(eager, solo.result, "eager", bound)
    agree = [name for name, ref in runs.references.items()
             if ref.result is not None and not numerics(ref.result, eager, name, bound).beyond_bound]
    engine_wrong = apart.beyond_bound and bool(agree)
    if engine_wrong:
        line = (f"eager itself departs from an unpadded single-request run by max |Δ logprob| {apart.noise:.3g} "
                f"(bound {bound:.3g}) and the padded references agree with eager: the engine is wrong in every "
                f"mode, not the graphs")
    elif apart.beyond_bound:
        line = (f"eager departs from an unpadded single-request run by max |Δ logprob| {apart.noise:.3g} "
                f"(bound {bound:.3g}), and so do the padded references from eager")
    else:
        line = (f"eager agrees with an unpadded single-request run (max |Δ logprob| {apart.noise:.3g}, within "
                f"the bound {bound:.3g})")
    return {"max_abs_logprob_diff": apart.noise, "bound": bound, "token_flips": apart.token_flips,
            "references_agreeing_with_eager": agree, "engine_wrong": engine_wrong, "line": line}
