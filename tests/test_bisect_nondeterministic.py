"""A forward that does not reproduce its own outputs gets no one-variable diagnosis it did not isolate.

CUDA's `index_copy_` leaves a KV slot that several tokens of one forward write
to whichever write lands last, and the winner changes from launch to launch.
The CPU's is sequential, so these tests stand in for CUDA with a write that
lands the tokens in a fresh random order on every call (the same seam in eager,
the reference and every replay). With PAD slots clamped onto slot 0 (the bug
corpus's `pad-slot-clamped`), graphs and reference part at random; the
bisector must see that the forward is not reproducible and name the padded KV
writes, as it does on an H100.
"""

from __future__ import annotations

import torch

import parity.models.paged_attention as paged_attention
from parity.graphs.capture import CapturedGraph
from parity.harness.request import RunRequest
from parity.harness.session import run_session


def racy_write_kv(k_cache, v_cache, slot_mapping, key, value) -> None:
    order = torch.randperm(key.shape[0], device=key.device)
    rows = paged_attention._cache_rows(k_cache, slot_mapping)[order]
    k_cache.index_copy_(0, rows, key[order])
    v_cache.index_copy_(0, rows, value[order])


def clamped_rows(cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    return slot_mapping.clamp(min=0)


def test_racing_padded_kv_writes_are_a_padding_leak_not_a_guess(monkeypatch):
    torch.manual_seed(0)     # the race's write orders: the same whatever ran before in this worker
    monkeypatch.setattr(paged_attention, "write_kv", racy_write_kv)
    monkeypatch.setattr(paged_attention, "_cache_rows", clamped_rows)
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated"))
    assert outcome.summary["modes"]["full"]["verdict"] == "drift"
    d = outcome.summary["diagnoses"]["full"]
    assert (d["kind"], d["buffers"]) == ("PADDING_LEAK", ["slot_mapping"]), d
    assert any("not deterministic" in line for line in d["evidence"]), d["evidence"]
    assert any(line.startswith("first-layer KV rows that differ between re-runs: slots 0") for line in d["evidence"])
    assert any("padded tokens write the KV cache of real requests: slots 0" in line for line in d["evidence"])


def test_a_forward_that_is_not_reproducible_gets_no_one_variable_answer(monkeypatch):
    """Noise in every FULL replay (nothing to do with padding): UNEXPLAINED, saying why."""
    replay = CapturedGraph.replay

    def noisy(self, meta):
        outputs = replay(self, meta)
        if self.runtime_mode == "full" and outputs and outputs[0].dim() == 2 and outputs[0].shape[-1] > 100:
            outputs[0].add_(torch.rand_like(outputs[0]) * 1e-3)
        return outputs

    monkeypatch.setattr(CapturedGraph, "replay", noisy)
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated"))
    d = outcome.summary["diagnoses"]["full"]
    assert (d["kind"], d["buffers"]) == ("UNEXPLAINED", []), d
    assert any("graph run's forward does not reproduce" in line for line in d["evidence"]), d["evidence"]
    assert not any("reference's forward" in line for line in d["evidence"]), d["evidence"]
    assert d["ruled_out"] and "race" in d["ruled_out"][0]


def test_a_buffer_rebound_after_capture_is_part_of_the_pre_state(monkeypatch):
    """A graph keeps reading and writing the buffer it captured after the registry moved on to a new tensor.

    The experiments' pre-state must include that orphan: otherwise every re-run
    of the forward starts from what the previous one wrote there, the forward
    looks non-deterministic and the reassignment goes unnamed.
    """
    from parity.engine.proposer import EagleProposer

    prepare = EagleProposer.prepare_prefill

    def rebinding(self, *args, **kwargs):
        dispatch, meta = prepare(self, *args, **kwargs)
        self.buffers.rebind("hidden_states", self.buffers["hidden_states"].clone())
        return dispatch, meta

    monkeypatch.setattr(EagleProposer, "prepare_prefill", rebinding)
    outcome = run_session(RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "piecewise"),
                                     "emulated"))
    d = outcome.summary["diagnoses"]["piecewise"]
    assert (d["kind"], d["buffers"]) == ("BUFFER_REASSIGNED", ["hidden_states"]), d
    assert not any("not deterministic" in line for line in d["evidence"]), d["evidence"]
