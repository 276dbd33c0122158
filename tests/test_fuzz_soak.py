"""`make fuzz`: the fuzz bodies of test_fuzz_inputs.py with random examples for a bounded time.

FUZZ_SECONDS (unset: this test is skipped) is shared equally by the input
kinds (the baselines' one-off setup runs before the clock); each kind runs
hypothesis searches of SOAK_CHUNK random examples until its share is spent
(an example that starts after that does nothing and is not counted). It prints the examples tried per kind, their exit codes, and
the failures found, and fails if there is any.
"""

from __future__ import annotations

import os
import time
import traceback

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fuzzcases
import fuzzenv
from fuzzcases import COUNTS, OUTCOMES, baseline_setup

KINDS = {**fuzzcases.KINDS, **fuzzenv.KINDS}

SECONDS = float(os.environ.get("FUZZ_SECONDS") or 0)
SOAK_CHUNK = 50


def _soak(kind: str, seconds: float) -> list[str]:
    """Random searches of `kind` until `seconds` have passed; the failures found (shrunk), as text."""
    strategies, body, _ = KINDS[kind]
    end, shrinking = time.monotonic() + seconds, []

    @settings(settings.get_profile("parity-soak"), max_examples=SOAK_CHUNK)
    @given(st.tuples(*strategies))
    def search(args):
        if shrinking or time.monotonic() < end:   # a failure found is shrunk whatever the clock says
            try:
                body(*args)
            except Exception:
                shrinking.append(1)
                raise

    failures = []
    while time.monotonic() < end:
        shrinking.clear()
        try:
            search()
        except Exception as exc:    # noqa: BLE001 - a failure found: record it, go on searching
            failures.append("".join(traceback.format_exception_only(type(exc), exc)).strip())
    return failures


@pytest.mark.skipif(not SECONDS, reason="set FUZZ_SECONDS (make fuzz) to soak")
def test_soak(capsys):
    baseline_setup()    # the baselines' one gate run, before the clock: it is no kind's share of the time
    failures = {kind: _soak(kind, SECONDS / len(KINDS)) for kind in KINDS}
    with capsys.disabled():
        print(f"\nfuzz soak: {SECONDS:.0f} s, profile parity-soak")
        print(f"{'input kind':<10} {'examples':>9}  exit codes")
        for kind in KINDS:
            codes = ", ".join(f"{code}: {n}" for (k, code), n in sorted(OUTCOMES.items(), key=str) if k == kind)
            print(f"{kind:<10} {COUNTS[kind]:>9}  {codes}")
        print(f"failures found: {sum(map(len, failures.values()))}")
        for kind, found in failures.items():
            for text in found:
                print(f"--- {kind}: {text[:600]} ... {text[-2500:]}")
    assert not any(failures.values())
