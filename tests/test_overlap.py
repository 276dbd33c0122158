"""The overlapped step loop (`overlap: true`): bit for bit the synchronous loop, no host read before its event.

On the CPU the streams are the emulated model (`parity/graphs/streams.py`): copies on
a side stream land only when an event after them is waited on, so a race is
deterministic. The same tests run on CUDA (`test_overlap_gpu.py`).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import make_specs
from overlap_kit import run, same_records
from parity.engine.records import Records
from parity.graphs import streams

MODES = ["eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"]


@pytest.mark.parametrize("mode", MODES)
def test_overlapped_loop_equals_the_synchronous_loop_bit_for_bit(random_pair, mode):
    sync, _ = run(random_pair, mode, overlap=False)
    overlapped, engine = run(random_pair, mode, overlap=True)
    assert same_records(sync, overlapped), mode
    assert engine.stager.issued == [] and engine.stager.keys      # it staged, and every copy was waited on
    if mode != "eager":
        assert sum(o.executor.replays for o in engine.owners()) > 0


def test_the_emulated_copy_reads_its_source_when_its_event_is_waited():
    """The model itself: a host that rewrites a staging buffer before the event races, one that waits does not."""
    G = streams
    copy = G.Stream()
    for wait_first in (False, True):
        staging, device = torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64)
        with G.stream(copy):
            device.copy_(staging, non_blocking=True)
        landed = G.Event()
        landed.record(copy)
        if wait_first:
            landed.synchronize()
        staging.copy_(torch.tensor([7, 8]))       # the host builds the next batch into the same slot
        G.current_stream().wait_event(landed)     # the consumer waits before its forward
        assert device.tolist() == ([1, 2] if wait_first else [7, 8])


class HostReads(TorchFunctionMode):
    """Every host read of a tensor; those of a storage a queued copy will still write are early."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__bool__, torch.Tensor.__repr__}

    def __init__(self):
        super().__init__()
        self.reads, self.early = 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS and isinstance(args[0], torch.Tensor):
            self.reads += 1
            if args[0].untyped_storage().data_ptr() in streams.pending_destinations():
                self.early.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_no_host_read_before_its_event_and_records_read_only_their_slot(random_pair, monkeypatch):
    read_from = []
    original = Records.read_logits

    def spy(self, entries, logits):
        read_from.append(logits.untyped_storage().data_ptr())
        return original(self, entries, logits)

    monkeypatch.setattr(Records, "read_logits", spy)
    syncs = []
    monkeypatch.setattr(streams.Event, "synchronize",
                        lambda self: syncs.append(__import__("sys")._getframe(1).f_code.co_name) or self._force())
    reads = HostReads()
    with reads:
        result, engine = run(random_pair, "full", overlap=True)
    slots = engine.stager.slot_storages
    assert reads.reads > 0 and reads.early == []
    # The records (the harness's tracing) read the verify logits only from the readback slot, one step late.
    assert read_from and set(read_from) <= slots
    # The host waits only where it consumes: the verify output, the drafts, a readback, a slot it rewrites.
    assert set(syncs) <= {"_wait_compute", "complete", "wait_reusable"}, set(syncs)
    assert syncs.count("complete") == int((result.forwards.phase == "verify").sum())    # one per step, late


@pytest.mark.parametrize("seed", range(10))
def test_no_false_alarm_over_ten_seeds(random_pair, seed):
    """Random batches and sampled drafts (temperature 1): the overlapped loop never parts from the synchronous."""
    specs = make_specs(3, seed=100 + seed, max_tokens=4, max_prompt=9, stagger=seed % 2)
    sync, _ = run(random_pair, "eager", overlap=False, specs=specs, temperature=1.0, seed=seed)
    overlapped, _ = run(random_pair, "eager", overlap=True, specs=specs, temperature=1.0, seed=seed)
    assert same_records(sync, overlapped), seed


def test_tree_drafts_are_refused_in_one_line(random_pair):
    from parity.errors import ParityInputError
    with pytest.raises(ParityInputError, match="overlap: true does not run tree drafts"):
        run(random_pair, "eager", overlap=True, topk=2, num_draft_tokens=3, max_num_batched_tokens=64)

