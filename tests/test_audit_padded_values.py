"""The audit's check of what padded rows store (audit/padded_values.py), on a hand-made engine.

A graph of 4 rows: each row embeds its token, writes it into a cache at its
slot (`slots`), writes a scratch copy nobody reads (`scratch`, at `rows`), and
reads back the cache slots its block (`blocks`, two slots a row) holds; the
first slot of each request holds its prefill already. The
engine's pad slot is a marker no real slot of a step holds; the bug sets it to
a slot a live request reads (0, request 0's first), the correct engine to a
trash slot, or to slot 0 when slot 0 is reserved (SGLang's convention). Input
poisoning leaves every one of those markers alone, so only poisoning what
the padded rows store can tell them apart. CPU through parity.audit.emulated;
the `gpu` twin replays real CUDA graphs and must give the same answers.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import audited_graph, emulated
from parity.audit.padded_values import StorePoisoner

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Engine:
    def __init__(self, device: str, pad_slot: int, first_slot: int):
        self.device, self.pad_slot, self.first = device, pad_slot, first_slot
        gen = torch.Generator().manual_seed(0)
        self.table = torch.randn(16, 4, generator=gen).to(device)
        self.cache = torch.randn(16, 4, generator=gen).to(device)       # each request's first key: its prefill
        self.scratch = torch.zeros(4, 4, device=device)
        z = lambda *shape: torch.zeros(shape, dtype=torch.long, device=device)  # noqa: E731
        self.tokens, self.slots, self.rows, self.blocks = z(4), z(4) + pad_slot, torch.arange(4, device=device), \
            z(4, 2) + pad_slot
        self.num_valid = 4
        G = torch.cuda if device == "cuda" else emulated
        if device == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.forward()
            torch.cuda.current_stream().wait_stream(stream)
        self.graph = G.CUDAGraph()
        with audited_graph(self.graph, self.forward, name="Engine.graph[4]", on_mismatch="record",
                           static_inputs={"slots": self.slots, "blocks": self.blocks, "tokens": self.tokens},
                           num_valid=lambda: self.num_valid) as self.audit:
            self.out = self.audit()

    def forward(self):
        x = self.table[self.tokens]
        self.cache.index_copy_(0, self.slots, x)
        self.scratch.index_copy_(0, self.rows, x * 3)
        return self.cache[self.blocks].sum(1) + x

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Real rows r = 0..n-1 hold request r, decoding into its second slot, first + 2r + 1 (its first one
        holds its prefill)."""
        n = len(tokens)
        self.num_valid = n
        self.tokens[:n] = torch.tensor(tokens, device=self.device)
        self.slots.fill_(self.pad_slot)
        self.blocks.fill_(self.pad_slot)
        for r in range(n):
            self.slots[r] = self.first + 2 * r + 1
            self.blocks[r] = torch.tensor([self.first + 2 * r, self.first + 2 * r + 1])
        self.graph.replay()
        return self.out[:n].clone()


def _run(engine: Engine) -> Engine:
    engine.step([1, 2, 3])
    engine.step([4, 5])
    return engine


@pytest.mark.parametrize("device", DEVICES)
def test_padded_rows_storing_into_a_slot_real_rows_read_are_named_by_the_input_that_sends_them_there(device):
    engine = _run(Engine(device, pad_slot=0, first_slot=0))     # BUG: the pad slot is request 0's first slot
    errors = engine.audit.errors
    assert errors and {e.kind for e in errors} == {"PADDING_LEAK"}
    assert all(e.buffers == ["self.slots"] for e in errors), [e.buffers for e in errors]   # not tokens, blocks
    assert "index_copy_.default writing self.cache: what it stores for the padded rows 3..3" in str(errors[0])
    assert "out rows [0] differ" in str(errors[0])      # request 0 reads its first slot: the pad's store


def test_under_inference_mode_as_vllm_captures_the_answers_are_the_same():
    with torch.inference_mode():
        leaky, clean = _run(Engine("cpu", pad_slot=0, first_slot=0)), _run(Engine("cpu", pad_slot=15, first_slot=0))
    assert {(e.kind, tuple(e.buffers)) for e in leaky.audit.errors} == {("PADDING_LEAK", ("self.slots",))}
    assert clean.audit.errors == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad_slot, first_slot", [(15, 0), (0, 1)], ids=["trash-slot", "reserved-slot-0"])
def test_a_pad_marker_no_real_row_reads_is_inert(device, pad_slot, first_slot):
    engine = _run(Engine(device, pad_slot=pad_slot, first_slot=first_slot))
    assert engine.audit.errors == [] and engine.audit.mismatches == 0


WRITES = {
    "index_copy_": lambda dest, index, src: dest.index_copy_(0, index, src),
    "index_put_": lambda dest, index, src: dest.index_put_((index,), src),
    "scatter_": lambda dest, index, src: dest.scatter_(0, index[:, None].expand(-1, 2), src),
    "put_": lambda dest, index, src: dest.put_(index * 2, src[:, 0].contiguous()),
}


@pytest.mark.parametrize("write", WRITES)
def test_each_indexed_write_stores_its_real_rows_values_for_its_padded_rows(write):
    index, src = torch.tensor([5, 6, 7, 0]), torch.arange(1.0, 9.0).view(4, 2)     # rows 2 and 3 are padding
    plain, poisoned = torch.zeros(8, 2), torch.zeros(8, 2)
    WRITES[write](plain, index, src)
    with StorePoisoner(num_valid=2, padded=4, poison={0}) as poisoner:
        WRITES[write](poisoned, index, src)
    assert len(poisoner.padded_writes) == 1
    rows = [5, 6, 7, 0]
    assert torch.equal(poisoned[rows[:2]], plain[rows[:2]])                         # real rows: as they were
    # padded rows store real rows' values, shuffled: row 2 gets row 1's, row 3 row 0's
    assert torch.equal(poisoned[[7, 0]], plain[[6, 5]]) and not torch.equal(poisoned[[7, 0]], plain[[7, 0]])


def test_writes_not_chosen_or_not_led_by_the_padded_batch_are_left_alone():
    dest, src = torch.zeros(8, 2), torch.arange(1.0, 9.0).view(4, 2)
    with StorePoisoner(num_valid=2, padded=4, poison={1}) as poisoner:
        dest.index_copy_(0, torch.tensor([5, 6, 7, 0]), src)              # padded write 0: not chosen
        dest.index_copy_(0, torch.tensor([1, 2]), src[:2])                  # two rows: not led by the batch
    assert poisoner.padded_writes == [0] and torch.equal(dest[[7, 0]], src[[2, 3]])
