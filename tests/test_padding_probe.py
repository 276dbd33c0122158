"""The padding probe on hand-made owners: each forward reads one thing it should not, and the probe must name
exactly that (or nothing, for a forward that reads only live entries or does not reproduce itself)."""

from __future__ import annotations

import dataclasses

import torch

from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder
from parity.engine.owner import Forward, Owner
from parity.engine.padding_probe import PaddingProbe
from parity.graphs.descriptor import Dispatch

BLOCK = 4


class Toy(Owner):
    """Two live tokens in one live row, padded to 4 tokens and 2 rows; `body` is the forward."""

    name = "target"

    def __init__(self, body):
        super().__init__()
        self.buffers = InputBuffers(self.name, torch.device("cpu"))
        register_attention_buffers(self.buffers, 8, 4, 4)
        self.kv_cache = PagedKVCache(1, 8, BLOCK, 1, 2, torch.float32, torch.device("cpu"))
        self.body = body
        b = self.buffers
        b["input_ids"][:2] = torch.tensor([5, 6])
        b["positions"][:4] = torch.tensor([0, 1, 0, 0])
        b["query_start_loc"][:3] = torch.tensor([0, 2, 2])
        b["seq_lens"][:2] = torch.tensor([2, 0])
        b["slot_mapping"][:4] = torch.tensor([0, 1, -1, -1])
        b["block_table"][0, 0] = 0

    def forwards(self):
        return (Forward("verify", self.body, 8, 1, ("logits",)),)


DISPATCH = Dispatch("verify", "full", 2, 1, 4, 2, None)


def probe_of(body, free=(3, 4)):
    owner = Toy(lambda t, r, meta: (body(owner.buffers, owner.kv_cache),))
    probe = PaddingProbe(lambda: list(free), BLOCK)
    probe.execute(owner, DISPATCH, owner.forward("verify").fn, None)
    return probe


def live_only(b, kv):
    return b["input_ids"][:4].float() * torch.tensor([1.0, 1.0, 0.0, 0.0])


def test_a_forward_that_reads_only_live_entries_has_no_leak():
    probe = probe_of(live_only)
    assert probe.probed == 1 and probe.leaks == []


def test_a_tail_read_is_named_with_its_buffer():
    probe = probe_of(lambda b, kv: live_only(b, kv) + b["seq_lens"][3].float())
    [leak] = probe.leaks
    assert (leak.buffers, leak.kinds) == (["seq_lens"], ["tail"]), leak


def test_a_padded_row_read_for_a_live_row_is_named():
    probe = probe_of(lambda b, kv: live_only(b, kv) + b["block_table"][1, 0].float())
    [leak] = probe.leaks
    assert (leak.buffers, leak.kinds) == (["block_table"], ["padded"]), leak


def test_a_read_of_a_free_kv_slot_is_named():
    probe = probe_of(lambda b, kv: live_only(b, kv) + kv.keys[0][3 * BLOCK, 0, 0])
    [leak] = probe.leaks
    assert (leak.buffers, leak.kinds) == (["kv_cache"], ["kv"]), leak


def test_padded_slots_off_their_pad_value_are_the_contract_breach_not_the_inputs():
    def body(b, kv):
        # the padded tokens' slot entries point at live slot 0; their key is their own (poisoned) token id
        rows = b["slot_mapping"][:4].remainder(kv.keys[0].shape[0])
        kv.keys[0].index_copy_(0, rows, b["input_ids"][:4].float().view(4, 1, 1).expand(4, 1, 2).contiguous())
        return live_only(b, kv) + kv.keys[0][0, 0, 0]

    owner = Toy(lambda t, r, meta: (body(owner.buffers, owner.kv_cache),))
    owner.buffers["slot_mapping"][2] = 0          # the builder left a stale slot in a padded entry
    probe = PaddingProbe(lambda: [3, 4], BLOCK)
    probe.execute(owner, DISPATCH, owner.forward("verify").fn, None)
    [leak] = probe.leaks
    assert (leak.buffers, leak.kinds) == (["slot_mapping"], ["contract"]), leak


def test_a_forward_that_does_not_reproduce_itself_gets_no_name():
    probe = probe_of(lambda b, kv: live_only(b, kv) + torch.rand(4))
    [leak] = probe.leaks
    assert leak.buffers == [] and any("does not reproduce" in line for line in leak.evidence), leak


def test_a_registered_pad_value_the_step_advance_turns_into_the_breach_is_named_with_it():
    """seq_lens registered with pad value 1: a draft step's advance makes the padded row live and moves its slot
    into real KV. The forward's breach is slot_mapping; the probe names seq_lens with it, by the advance."""
    def body(b, kv):
        rows = b["slot_mapping"][:2].remainder(kv.keys[0].shape[0])
        kv.keys[0].index_copy_(0, rows, b["input_ids"][:2].float().view(2, 1, 1).expand(2, 1, 2).contiguous())
        return b["input_ids"][:2].float() * torch.tensor([1.0, 0.0]) + kv.keys[0][1, 0, 0]

    owner = Toy(lambda t, r, meta: (body(owner.buffers, owner.kv_cache),))
    b = owner.buffers
    b._specs["seq_lens"] = dataclasses.replace(b.spec("seq_lens"), pad=1)       # the wrong registered pad value
    owner.builder = MetadataBuilder(b, owner.kv_cache, BLOCK, 32)
    owner.forwards = lambda: (Forward("draft_step", owner.body, 8, 1, ("logits",)),)
    b["input_ids"][:2], b["positions"][:2] = torch.tensor([5, 0]), torch.tensor([3, 0])
    b["query_start_loc"][:3], b["seq_lens"][:2] = torch.tensor([0, 1, 1]), torch.tensor([4, 1])
    b["slot_mapping"][:2] = torch.tensor([3, 1])   # the last advance moved the padded row's slot into live KV
    dispatch = Dispatch("draft_step", "full", 1, 1, 2, 2, None)
    meta = owner.builder.make_view(2, 2, 1, 1, 1, 4)
    probe = PaddingProbe(lambda: [3, 4], BLOCK)
    probe.execute(owner, dispatch, owner.forward("draft_step").fn, meta)
    [leak] = probe.leaks
    assert (leak.buffers, leak.kinds) == (["seq_lens", "slot_mapping"], ["contract"]), leak
    assert any("registered pad value of seq_lens makes padded rows live" in line for line in leak.evidence)
