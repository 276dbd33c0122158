"""The overlapped loop on CUDA: the same parity and the same named faults as on the emulated backend.

On CUDA a staging race is real and shows only under some timings; `SlowCopies` makes it
show every time by spinning each copy stream before the copy (`torch.cuda._sleep`), so the
host and the compute stream run ahead of the copies, as the emulated model has them.
"""

from __future__ import annotations

import pytest
import torch

from conftest import build_random_pair
from overlap_kit import run, same_records
from parity.diagnosis.kinds import STAGING_RACE
from parity.engine.staging import Stager
from parity.faults.catalog import FAULTS
from parity.faults.seam import MUTATIONS

pytestmark = pytest.mark.gpu
SPIN = 2_000_000     # cycles: about a millisecond, far longer than a tiny forward
# A readback races the *next* verify, which the host enqueues only after the step's drafts (milliseconds of
# Python): the readback must outlast that for its race to show with every other copy prompt.
READBACK_SPIN = 40_000_000


class SlowCopies:
    """Every staged copy and readback starts after a spin on its stream."""

    def issue(self, key, target, source, s):
        with torch.cuda.stream(s):
            torch.cuda._sleep(SPIN)
        super().issue(key, target, source, s)

    def readback(self, key, source, phase):
        with torch.cuda.stream(self.readback_stream):
            torch.cuda._sleep(READBACK_SPIN)
        return super().readback(key, source, phase)


@pytest.fixture(scope="module")
def cuda_pair():
    target, head = build_random_pair()
    return target.to("cuda"), head.to("cuda")


@pytest.mark.parametrize("mode", ["eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"])
def test_overlapped_loop_equals_the_synchronous_loop_on_cuda(cuda_pair, mode):
    sync, _ = run(cuda_pair, mode, False, device="cuda")
    overlapped, _ = run(cuda_pair, mode, True, stager=type("Slow", (SlowCopies, Stager), {}), device="cuda")
    assert same_records(sync, overlapped), mode


@pytest.mark.parametrize("name", ["rows-freed-before-readback", "count-copied-without-wait",
                                  "staging-rewritten-early"])
def test_each_overlap_fault_is_named_on_cuda(cuda_pair, name):
    from test_overlap_faults import MODE, SPECS, diagnose
    reference = run(cuda_pair, MODE, False, specs=SPECS, device="cuda")[0]
    # The fault's mixin first: a copy it moves to a stream of its own is slowed on that stream.
    stager = type("Slow", (MUTATIONS[name].mixin, SlowCopies, Stager), {})
    found = diagnose(cuda_pair, reference, stager, device="cuda")
    assert found is not None and found.kind == STAGING_RACE
    assert found.buffers == list(FAULTS[name].buffers), found.evidence
