"""The hybrid target on CUDA (make test-gpu): the CPU tests of test_hybrid.py on the real backend.

CUDA graphs replay every mode bitwise equal to its probed padded reference; each hybrid fault of the catalog
leaks through the buffer the CPU names (on CUDA, index_copy_ with a padded row's duplicate slot may race a
live row's write: the probe then names the breach by the repair that makes the forward reproduce itself).
The full `parity run` path on a realistic shape is docs/hybrid.md's 8B command.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_hybrid import GRAPH_MODES, HYBRID_FAULTS, fault_leaks, five_modes_bitwise, hybrid_pair

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.xdist_group("gpu-hybrid")]


@pytest.fixture(scope="module")
def cuda_pair():
    return hybrid_pair(device="cuda")


def test_every_mode_is_bitwise_equal_to_its_padded_reference_on_cuda(cuda_pair):
    five_modes_bitwise(cuda_pair, "cuda")


@pytest.mark.parametrize("fault", HYBRID_FAULTS)
def test_each_hybrid_fault_breaks_the_state_slot_contract_on_cuda(cuda_pair, fault):
    for mode in GRAPH_MODES:
        fault_leaks(cuda_pair, fault, mode)
