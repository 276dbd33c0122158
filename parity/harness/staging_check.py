"""The run-level STAGING_RACE check of an overlapped scenario (`diagnose/staging.py` runs the experiments).

A drifting graph mode of a scenario with `overlap: true` is first re-run with its
host staging changed (synchronous, per buffer, per event); only when synchronous
staging does not restore parity with the mode's padded reference do the other
diagnoses take over.
"""

from __future__ import annotations

import time

from parity.diagnose import staging
from parity.graphs.tp_agree import agree_same
from parity.harness.modes import RunSet, capture_policy, run_mode
from parity.harness.scenario import Scenario


def staging_diagnosis(pair, scenario: Scenario, mode: str, backend: str, device, request, runs: RunSet) -> dict | None:
    """STAGING_RACE for an overlapped `mode` (a dict, with its seconds), or None: not overlapped, not a race."""
    run = runs.runs.get(mode)
    reference = runs.references.get(runs.reference_of.get(mode, ""))
    applies = not (not scenario.overlap or run is None or run.result is None or not run.staged
                   or reference is None or reference.result is None)
    # NOTE: under TP its re-runs hold collectives: ranks that would not all run them part here.
    if not agree_same("staging check applies", applies):
        return None
    policy = capture_policy(scenario, request.policy)

    def rerun(sync):
        return run_mode(pair, scenario, mode, backend, device, request.parts, policy, sync=sync).result

    start = time.perf_counter()
    found = staging.diagnose(rerun, reference.result, run.result, run.staged, mode)
    if found is None:
        return None
    found.timing = {"bisect_seconds": round(time.perf_counter() - start, 3)}
    return found.as_dict()
