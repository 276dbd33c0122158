"""On CUDA every run gives back what it took: allocated memory returns to the post-load baseline after each.

The embedded tiny pair on the GPU, every mode and padded reference of the
default scenario one after another (real CUDA graphs and pools): each run's
`memory` says it started from the baseline and left 0 bytes behind, and a
whole session (a drifting mode bisected included) leaves the device as it
found it. The measured peaks are printed next to the memory plan's figures.
"""

from __future__ import annotations

import pytest
import torch

from parity.faults.seam import apply
from parity.graphs.modes import MODES
from parity.harness.modes import run_modes
from parity.harness.request_plan import plan_pair
from parity.harness.release import reclaim
from parity.harness.request import RunRequest
from parity.harness.scenario import load_scenario
from parity.harness.session import run_session
from parity.models.pair import load_pair

pytestmark = pytest.mark.gpu

SCENARIO = "scenarios/default.yaml"
DEVICE = torch.device("cuda")


def test_every_run_returns_to_the_post_load_baseline():
    reclaim(DEVICE)
    before_load = torch.cuda.memory_allocated(DEVICE)
    pair = load_pair("tiny-llama3-eagle", device=DEVICE)
    reclaim(DEVICE)
    baseline = torch.cuda.memory_allocated(DEVICE)
    assert baseline > before_load
    scenario = load_scenario(SCENARIO)
    runs = run_modes(pair, scenario, MODES, "cuda", DEVICE)
    assert len(runs.all_runs()) == 8
    plan = plan_pair(pair.target_dir, pair.draft_dir, torch.float32, scenario, MODES, DEVICE)
    for name, run in runs.all_runs().items():
        memory = run.memory
        predicted = plan.total(name) if name in plan.modes else None
        print(f"{name:<20} baseline {memory['baseline_bytes']} peak {memory['peak_bytes']} "
              f"peak reserved {memory['peak_reserved_bytes']} leftover {memory['leftover_bytes']} "
              f"plan {predicted}")
        assert memory["baseline_bytes"] == baseline, f"{name} started above the post-load baseline"
        assert memory["leftover_bytes"] == 0, f"{name} left {memory['leftover_bytes']} bytes allocated"
        assert memory["peak_bytes"] >= baseline
    assert sum(runs.runs["full"].capture["graphs"].values()) > 0
    reclaim(DEVICE)
    assert torch.cuda.memory_allocated(DEVICE) == baseline


def test_a_session_with_a_bisection_leaves_the_device_as_it_found_it():
    reclaim(DEVICE)
    before = torch.cuda.memory_allocated(DEVICE)
    parts, policy = apply(["reassign-seq-lens"])
    request = RunRequest("tiny-llama3-eagle", SCENARIO, ("eager", "full"), "cuda", parts=parts, policy=policy)
    outcome = run_session(request)
    assert outcome.summary["verdict"] == "drift" and outcome.summary["diagnoses"]["full"]["kind"] != "NONE"
    assert outcome.summary["measured"]["memory"]["full"]["leftover_bytes"] == 0
    reclaim(DEVICE)
    assert torch.cuda.memory_allocated(DEVICE) == before
