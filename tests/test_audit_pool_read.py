"""POOL_ALIAS is told by a read: two forwards share one pool, and one's output is overwritten by the other's replay.

A draft and a target forward graphed in one pool, as an engine captures them
(nano-vllm, vLLM): the target's temporaries land where the draft's return was.
An engine that copies the return into a buffer of its own inside the capture
(nano-vllm's `outputs[:bs] = model(...)`) never reads it after: no finding.
One that keeps the return by reference and reads it after the target's
replay reads the target's temporaries: POOL_ALIAS, naming the draft's output.
"""

from __future__ import annotations

import torch

from parity.audit import auto_audit, emulated


class Forwards:
    def __init__(self):
        self.x = torch.linspace(-1, 1, 4 * 128).view(4, 128)
        self.w = torch.linspace(-1, 1, 128 * 128).view(128, 128)
        self.draft_out = torch.zeros(4, 128)

    def draft(self) -> torch.Tensor:
        return torch.tanh(self.x @ self.w)

    def target(self) -> torch.Tensor:
        a = torch.relu(self.x @ self.w)              # temporaries live at once, then the output
        b, c = a * 2, a + 1
        return (a * b + c) @ self.w


def capture(copied: bool):
    """Both forwards in one pool, the draft first; its return copied into `draft_out` inside the capture, or kept
    weakly (the graph's own memory). Returns (forwards, draft graph, target graph, what the program reads)."""
    fwd, pool = Forwards(), emulated.graph_pool_handle()
    draft, target = emulated.CUDAGraph(), emulated.CUDAGraph()
    with emulated.graph(draft, pool=pool):
        if copied:
            fwd.draft_out.copy_(fwd.draft())
        else:
            strong = fwd.draft()
    if copied:
        read = fwd.draft_out
    else:
        read = emulated.weak_ref_tensors(strong)
        del strong                                  # the pool may hand its memory out again
    with emulated.graph(target, pool=pool):
        strong = fwd.target()
    target_out = emulated.weak_ref_tensors(strong)
    return fwd, draft, target, read, target_out


def decode(copied: bool):
    """Two steps of draft then target; the draft's tokens read after the target's replay."""
    fwd, draft, target, read, _ = capture(copied)
    seen = []
    for _ in range(2):
        fwd.x.add_(0.5)
        draft.replay()
        target.replay()
        seen.append(read.sum(dim=1))              # the engine reads the draft's output after the target ran
    return seen, fwd


def test_a_return_copied_inside_the_capture_is_never_a_pool_alias():
    with auto_audit(every=1) as session:
        seen, fwd = decode(copied=True)
    assert not session.errors, [(e.kind, e.buffers) for e in session.errors]
    assert torch.equal(seen[-1], torch.tanh(fwd.x @ fwd.w).sum(dim=1))


def test_a_return_kept_by_reference_and_read_after_the_other_forward_is_a_pool_alias():
    with auto_audit(every=1) as session:
        decode(copied=False)
    assert [(e.kind, e.buffers) for e in session.errors] == [("POOL_ALIAS", ["out"])]
    evidence = session.errors[0].diagnosis["evidence"]
    assert "changed during the replay of graph 'Forwards.target()'" in evidence[0]
    assert "test_audit_pool_read.py" in evidence[-1] and "read it" in evidence[-1]     # the program's read
