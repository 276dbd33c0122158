"""The greedy draft step's sampling on CUDA: one Triton kernel against torch's argmax, log_softmax and top-2.

The token is argmax's (its first maximum) exactly; the log-probability and
the gap are the same formulas summed in another order, so they are held to
torch's within a few float32 steps, and ties give a gap of exactly 0. What
graph parity needs is exact: a row's bits are the same alone, in a batch, in
a batch whose padded rows hold garbage, and in a CUDA graph's replay.
"""

from __future__ import annotations

import pytest
import torch

from parity.models.greedy_draft import greedy_draft, top_gap

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCABS = (2, 5, 4095, 4096, 4097, 32000, 128256)


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    if seed % 3 == 0:       # small integers: ties for first and second
        x = torch.randint(-4, 4, (rows, vocab), generator=g, device="cuda").float()
    else:
        x = torch.randn(rows, vocab, generator=g, device="cuda") * (1 + seed % 5)
    if seed % 4 == 1:
        x[:, ::3] = float("-inf")       # a draft vocabulary inside the target's
    return x


def _torch(x: torch.Tensor, d2t):
    drawn = x.argmax(-1)
    lp = torch.log_softmax(x, dim=-1)
    return drawn if d2t is None else drawn + d2t[drawn], lp.gather(1, drawn.unsqueeze(1)), top_gap(lp)


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_kernel_is_argmax_log_softmax_and_top2(vocab):
    for seed in range(12):
        x = _logits(1 + seed % 9, vocab, seed)
        d2t = torch.randint(0, 50, (vocab,), device="cuda") if seed % 2 else None
        tokens, logprobs, gaps = greedy_draft(x, d2t)
        want_tokens, want_lp, want_gap = _torch(x, d2t)
        assert torch.equal(tokens, want_tokens) and tokens.dtype == torch.int64
        torch.testing.assert_close(logprobs, want_lp, rtol=4e-7, atol=4e-7)
        torch.testing.assert_close(gaps, want_gap, rtol=4e-7, atol=4e-7)
        top = x.topk(2, dim=-1).values
        tied = top[:, 0] == top[:, 1]
        assert torch.equal(gaps[tied], torch.zeros_like(gaps[tied]))


def test_one_kernel_runs():
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = _logits(8, 32000, 1)
    d2t = torch.zeros(32000, dtype=torch.int64, device="cuda")
    greedy_draft(x, d2t)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        greedy_draft(x, d2t)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert kernels == ["_greedy_draft_kernel"], kernels


@pytest.mark.parametrize("vocab", (4097, 32000))
def test_a_rows_bits_do_not_depend_on_the_batch(vocab):
    x = _logits(8, vocab, 2)
    alone = [greedy_draft(x[i:i + 1].clone(), None) for i in range(8)]
    padded = torch.cat([x, torch.full((5, vocab), float("nan"), device="cuda")])
    padded[9, 7] = float("inf")
    for batch in (greedy_draft(x, None), greedy_draft(padded, None)):
        for i in range(8):
            assert all(torch.equal(a[i], b[0]) for a, b in zip(batch, alone[i]))


def test_a_graph_replay_gives_the_eager_bits():
    x = _logits(8, 32000, 4)
    d2t = torch.randint(0, 50, (32000,), device="cuda")
    static = x.clone()
    greedy_draft(static, d2t)       # compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = greedy_draft(static, d2t)
    for seed in (5, 6, 7):
        fresh = _logits(8, 32000, seed)
        static.copy_(fresh)
        graph.replay()
        eager = greedy_draft(fresh, d2t)
        assert all(torch.equal(a, b) for a, b in zip(out, eager))
