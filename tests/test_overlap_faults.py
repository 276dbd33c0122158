"""Each overlapped-loop fault of the catalog is named STAGING_RACE with its buffer, event and step.

The stage (`parity/diagnose/staging.py`) gets only a way to re-run the mode under a
staging experiment, the reference, and the staged buffers; it is told nothing of the
fault. On the emulated backend the race is the streams model's (docs/overlap.md); the
CUDA counterpart is `test_overlap_gpu.py`.
"""

from __future__ import annotations

import pytest

from conftest import make_specs
from overlap_kit import K, run, with_mixin
from parity.diagnose import staging
from parity.diagnosis.kinds import STAGING_RACE
from parity.faults.catalog import FAULTS
from parity.faults.seam import MUTATIONS

MODE = "full_decode_only"
SPECS = make_specs(3, seed=21, max_tokens=4, max_prompt=9, stagger=1, avoid_prompt_len=K + 1)
# fault -> the event its race crossed: `free` (a slot or rows reused before the copy read them), `ready` (a
# forward read a buffer before its copy landed)
EVENTS = {"rows-freed-before-readback": "free", "count-copied-without-wait": "ready",
          "staging-rewritten-early": "free"}


@pytest.fixture(scope="module")
def reference(random_pair):
    return run(random_pair, MODE, overlap=False, specs=SPECS)[0]


def diagnose(pair, reference, stager, device="cpu"):
    overlapped, engine = run(pair, MODE, True, specs=SPECS, stager=stager, device=device)
    return staging.diagnose(lambda sync: run(pair, MODE, True, specs=SPECS, stager=stager, sync=sync,
                                             device=device)[0],
                            reference, overlapped, engine.stager.phases(), MODE)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_each_overlap_fault_is_named_by_experiment(random_pair, reference, name):
    fault = FAULTS[name]
    found = diagnose(random_pair, reference, with_mixin(MUTATIONS[name].mixin))
    assert found is not None and found.kind == fault.kind == STAGING_RACE
    assert found.buffers == list(fault.buffers), found.evidence
    assert found.step is not None and found.phase and found.experiment
    assert f"event: {EVENTS[name]}" in found.evidence[-1], found.evidence


def test_a_divergence_staging_does_not_explain_is_no_staging_race(random_pair):
    """Where synchronous staging does not restore parity, the stage returns nothing (the other stages go on)."""
    overlapped, engine = run(random_pair, "eager", True, specs=SPECS)
    other = run(random_pair, "eager", False, specs=SPECS, temperature=1.0)[0]    # a run the mode cannot match
    runs = []
    assert staging.diagnose(lambda sync: runs.append(sync) or run(random_pair, "eager", True, specs=SPECS,
                                                                  sync=sync)[0],
                            other, overlapped, engine.stager.phases(), "eager") is None
    assert len(runs) == 1 and set(runs[0]) == set(engine.stager.keys)     # one experiment: all synchronous
