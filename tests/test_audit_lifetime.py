"""OUTPUT_ALIASED through the audit: a graph's output read after another graph of its forward overwrote it.

A tiny forward graphed at batch 2 and 4 in one pool, outputs held weakly (as
vLLM holds them): the batch-4 graph's temporaries land where the batch-2
graph's output was. Reading that output after the batch-4 replay is the bug;
copying it first, or reading it after its own graph replays again, is not.
"""

from __future__ import annotations

import pytest
import torch

from parity.audit import GraphParityError, auto_audit, emulated


class Forward:
    def __init__(self):
        self.x = torch.linspace(-1, 1, 4 * 128).view(4, 128)
        self.w = torch.linspace(-1, 1, 128 * 128).view(128, 128)

    def step(self, bs: int) -> torch.Tensor:
        a = torch.relu(self.x[:bs] @ self.w)              # temporaries live at once, then the output
        b, c = a * 2, a + 1
        return (a * b + c) @ self.w


def graphs(program):
    fwd, pool, out = Forward(), emulated.graph_pool_handle(), {}
    g = {bs: emulated.CUDAGraph() for bs in (4, 2)}
    for bs in (2, 4):                                     # smallest first: the larger one's temporaries reuse
        with emulated.graph(g[bs], pool=pool):
            strong = fwd.step(bs)
        out[bs] = emulated.weak_ref_tensors(strong)
        del strong
    return program(fwd, g, out)


def kept_past_the_next_size(fwd, g, out):
    g[2].replay()
    kept = out[2]                                         # BUG: by reference
    fwd.x.add_(1)
    g[4].replay()
    return kept.clone()


def copied_first(fwd, g, out):
    g[2].replay()
    kept = out[2].clone()
    fwd.x.add_(1)
    g[4].replay()
    return kept.clone()


def read_after_its_own_replay(fwd, g, out):
    g[2].replay()
    g[4].replay()
    g[2].replay()
    return out[2].clone()


def test_an_output_read_after_another_size_overwrote_it_is_output_aliased():
    with auto_audit(on_mismatch="record") as session:
        graphs(kept_past_the_next_size)
    assert [(e.kind, e.buffers, e.diagnosis["owner"]) for e in session.errors] == [
        ("OUTPUT_ALIASED", ["out"], "Forward.step(2)")]
    assert "test_audit_lifetime.py" in session.errors[0].diagnosis["evidence"][1]     # where the program read it
    assert torch._C._len_torch_dispatch_stack() == 0                                  # the watcher is gone


@pytest.mark.parametrize("program", [copied_first, read_after_its_own_replay])
def test_a_copy_or_the_newest_value_is_no_alias(program):
    with auto_audit(on_mismatch="raise") as session:
        graphs(program)
    assert session.errors == []


def test_the_program_reads_what_it_reads_unaudited_and_raise_stops_it_at_the_read():
    assert torch.equal(graphs(kept_past_the_next_size), _audited(kept_past_the_next_size, "record"))
    with pytest.raises(GraphParityError, match="OUTPUT_ALIASED"):
        _audited(kept_past_the_next_size, "raise")
    assert torch._C._len_torch_dispatch_stack() == 0


def _audited(program, on_mismatch):
    with auto_audit(on_mismatch=on_mismatch):
        return graphs(program)
