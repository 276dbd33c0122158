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
from tests.cuda_kernels import kernels

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


WIDTH = 3


def _run(x: torch.Tensor, d2t, col: int = 1, outs=None, check: bool = True):
    """The op on `x`, storing at column `col` of fresh [rows, WIDTH] outputs (or `outs`): (tokens, log-probabilities
    [rows, 1], gaps [rows, 1]) read back from that column; every other column must still hold its fill."""
    rows = x.shape[0]
    if outs is None:
        outs = (torch.full((rows, WIDTH), -7, dtype=torch.int64, device="cuda"),
                torch.full((rows, WIDTH), -7.0, device="cuda"), torch.full((rows, WIDTH), -7.0, device="cuda"))
    column = torch.full((1, 1), col, dtype=torch.int64, device="cuda").expand(rows, 1)
    returned = greedy_draft(x, d2t, column, *outs)
    others = [c for c in range(WIDTH) if c != col]
    assert not check or all(bool((o[:, others] == -7).all()) for o in outs)
    assert not check or torch.equal(returned, outs[0][:, col])
    return outs[0][:, col], outs[1][:, col:col + 1], outs[2][:, col:col + 1]


def _torch(x: torch.Tensor, d2t):
    drawn = x.argmax(-1)
    lp = torch.log_softmax(x, dim=-1)
    return drawn if d2t is None else drawn + d2t[drawn], lp.gather(1, drawn.unsqueeze(1)), top_gap(lp)


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_kernel_is_argmax_log_softmax_and_top2(vocab):
    for seed in range(12):
        x = _logits(1 + seed % 9, vocab, seed)
        d2t = torch.randint(0, 50, (vocab,), device="cuda") if seed % 2 else None
        tokens, logprobs, gaps = _run(x, d2t, col=seed % WIDTH)
        want_tokens, want_lp, want_gap = _torch(x, d2t)
        assert torch.equal(tokens, want_tokens) and tokens.dtype == torch.int64
        # a few float32 steps of the log of the row's sum, which both values are formed from
        steps = 4 * torch.finfo(torch.float32).eps * float(torch.logsumexp(x, -1).abs().max().clamp(min=1))
        torch.testing.assert_close(logprobs, want_lp, rtol=0, atol=steps)
        torch.testing.assert_close(gaps, want_gap, rtol=0, atol=steps)
        top = x.topk(2, dim=-1).values
        tied = top[:, 0] == top[:, 1]
        assert torch.equal(gaps[tied], torch.zeros_like(gaps[tied]))


def test_one_kernel_runs():
    x = _logits(8, 32000, 1)
    d2t = torch.zeros(32000, dtype=torch.int64, device="cuda")
    outs = tuple(torch.zeros((8, WIDTH), dtype=d, device="cuda") for d in (torch.int64, torch.float32, torch.float32))
    column = torch.ones((8, 1), dtype=torch.int64, device="cuda")
    assert kernels(lambda: greedy_draft(x, d2t, column, *outs)) == ["_greedy_draft_kernel"]


@pytest.mark.parametrize("vocab", (4097, 32000))
def test_a_rows_bits_do_not_depend_on_the_batch(vocab):
    x = _logits(8, vocab, 2)
    alone = [_run(x[i:i + 1].clone(), None) for i in range(8)]
    padded = torch.cat([x, torch.full((5, vocab), float("nan"), device="cuda")])
    padded[9, 7] = float("inf")
    for batch in (_run(x, None), _run(padded, None)):
        for i in range(8):
            assert all(torch.equal(a[i], b[0]) for a, b in zip(batch, alone[i]))


def test_a_graph_replay_gives_the_eager_bits():
    x = _logits(8, 32000, 4)
    d2t = torch.randint(0, 50, (32000,), device="cuda")
    static = x.clone()
    outs = tuple(torch.full((8, WIDTH), -7, dtype=d, device="cuda") for d in (torch.int64, torch.float32,
                                                                            torch.float32))
    _run(static, d2t, outs=outs)       # compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _run(static, d2t, outs=outs, check=False)      # nothing may sync inside a capture
    for seed in (5, 6, 7):
        fresh = _logits(8, 32000, seed)
        static.copy_(fresh)
        graph.replay()
        eager = _run(fresh, d2t)
        assert all(torch.equal(a, b) for a, b in zip(out, eager))
