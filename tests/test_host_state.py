"""Host state a forward advances itself: snapshotted around the forward, diffed, named by its attribute path.

A counter kept in Python (`self.calls += 1`, an RNG offset, a step index)
moves at every eager call, once at capture and never at replay. The snapshot
and its diff are tested on a hand-made owner; the bisector on an engine whose
target counts its forwards on a helper object (a site no catalog fault uses):
it must name that attribute, not call the reference non-deterministic.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from parity.diagnose.bisector import bisect_mode
from parity.diagnosis.kinds import FROZEN_AT_CAPTURE
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.engine.target_runner import TargetRunner
from parity.graphs.host_state import host_values, moved, name, restore
from parity.graphs.policy import CapturePolicy
from tests.conftest import engine_config, make_specs, pair_on


class Sampler:
    def __init__(self):
        self.offset = 0
        self.scale = 0.5
        self.table = torch.zeros(4)           # a tensor: not a host value


class HandMadeOwner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)
        self.calls = 0
        self.enabled = True
        self.window = (0, 4)
        self.sampler = Sampler()
        self.alias = self.sampler             # one object under two names
        self.nan = math.nan

    def forward(self, x):
        self.calls += 1
        self.sampler.offset += 3
        self.window = (self.window[0] + 1, self.window[1] + 1)
        return self.proj(x) + self.sampler.offset


def test_the_snapshot_holds_every_host_value_by_path_and_no_tensor():
    values = {name(p): v for p, v in host_values(HandMadeOwner()).items()}
    assert values["calls"] == 0 and values["enabled"] is True and values["sampler.scale"] == 0.5
    assert values["window"] == (0, 4), "a small tuple is one value, set by its holder"
    assert "window[0]" not in values
    assert values["proj.in_features"] == 2 and values["training"] is True
    assert not any(isinstance(v, torch.Tensor) for v in values.values())


def test_the_diff_names_what_the_forward_moved_once_each_and_restore_puts_it_back():
    owner = HandMadeOwner()
    before = host_values(owner)
    owner(torch.ones(1, 2))
    moves = {name(p): v for p, v in moved(before, owner).items()}
    # sampler.offset is reached as alias.offset too: one attribute, named by its first path; NaN is unchanged.
    assert moves == {"calls": (0, 1), "sampler.offset": (0, 3), "window": ((0, 4), (1, 5))}
    restore(before, owner)
    assert (owner.calls, owner.sampler.offset, owner.window) == (0, 0, (0, 4))
    assert moved(before, owner) == {}
    owner.enabled = 1                        # another type is another value
    assert [name(p) for p in moved(before, owner)] == ["enabled"]


def test_a_value_the_forward_made_is_a_move_from_absent_and_restore_takes_it_away():
    """A counter started lazily (`getattr(self, "steps", 0) + 1`) is not in the snapshot before the forward's first
    call: the diff reports it moved from absent, and restore deletes it, so a re-run starts where the first did
    (the red team's RNG offset, tests/test_redteam_rng_offset.py, was UNEXPLAINED before)."""
    from parity.graphs.roles import MISSING
    owner = HandMadeOwner()
    before = host_values(owner)
    owner.steps = getattr(owner, "steps", 0) + 1
    owner.sampler.fresh = 7
    owner.made = SimpleNamespace(count=3)     # a new object: its fields are not values an existing object held
    moves = {name(p): v for p, v in moved(before, owner).items()}
    assert moves == {"steps": (MISSING, 1), "sampler.fresh": (MISSING, 7)}
    restore(before, owner)
    assert not hasattr(owner, "steps") and not hasattr(owner.sampler, "fresh")
    assert moved(before, owner) == {}


class ScheduledTarget(TargetRunner):
    """The target keeps a schedule step on a helper object and advances it inside its verify forward; the logits
    carry a step-dependent bias (a stand-in for any step-keyed schedule read by the forward)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.schedule = SimpleNamespace(step=0)

    def logits(self, hidden):
        self.schedule.step += 1
        return super().logits(hidden) + 1e-3 * self.schedule.step


@pytest.mark.parametrize("backend", ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_counter_the_captured_forward_advances_is_named_by_its_attribute(backend, random_pair):
    config = engine_config()
    specs = make_specs(3, seed=1, max_tokens=6)
    pair, device = pair_on(backend, random_pair)
    make = lambda: SpecDecodeEngine(*pair, config, device, parts=EngineParts(target_runner=ScheduledTarget))  # noqa
    scenario = SimpleNamespace(capture_sizes=None, drafter_mode=None)
    found = bisect_mode(make, specs, "full", backend, scenario, CapturePolicy())
    assert (found.kind, found.buffers) == (FROZEN_AT_CAPTURE, ["schedule.step"]), (found.kind, found.evidence)
    assert (found.owner, found.phase, found.step) == ("target", "verify", 0)
    assert found.experiment.startswith("re-capture with only schedule.step at the value the forward starts from (0;")
    assert any("advanced by the forward itself" in line for line in found.evidence), found.evidence
    assert not any("not deterministic" in line for line in found.evidence), found.evidence

