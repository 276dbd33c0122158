"""A greedy draft step's sampling (`greedy_draft.greedy_draft`) in one Triton kernel.

One program per drafted row walks the row's logits once, in fixed chunks, and
keeps four running values: the maximum, the index of its first occurrence
(argmax's), the second-best value (the best of the other entries; equal to
the maximum on a tie, so the gap is 0 as topk's is) and the sum of
exp(x - max), rescaled whenever the maximum grows (the online softmax). Then
the token's log-probability is (max - max) - log(sum), as log_softmax forms it
for the argmax, and the gap is that minus (second - max) - log(sum).

The chunks and their order are fixed by the vocabulary size alone, and a row
reads nothing of another: a row's bits are the same in any batch, padded or
not. The values go to the row's `column` of the drafter's [n, K] outputs (the
three scatters the torch implementation runs). Only the CUDA implementation
of `greedy_draft.greedy_draft` calls it; the module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# 16384 x 8 warps: a 32k row in 5.8-6.0 us and a 128k row in 19.3-19.5 us on an H100 (4096, the first choice:
# 10.2-10.6 us and 37.8-38.2 us; 32768 is 0.2-1 us faster again, with twice the registers per thread).
BLOCK = 16384


@triton.jit
def _greedy_draft_kernel(logits_ptr, row_stride, d2t_ptr, column_ptr, column_stride, tokens_ptr, out_tokens_ptr,
                         tokens_stride, logprobs_ptr, logprobs_stride, gaps_ptr, gaps_stride, vocab, width,
                         HAS_D2T: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    cols = tl.arange(0, BLOCK)
    neg_inf = float("-inf")
    best = tl.full((), neg_inf, tl.float32)
    second = tl.full((), neg_inf, tl.float32)
    best_at = tl.full((), 0, tl.int64)
    total = tl.full((), 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + cols
        x = tl.load(base + idx, mask=idx < vocab, other=neg_inf)
        chunk_best = tl.max(x, axis=0)
        chunk_at = tl.min(tl.where(x == chunk_best, idx, vocab), axis=0).to(tl.int64)
        chunk_second = tl.max(tl.where(idx == chunk_at, neg_inf, x), axis=0)
        # The second best overall: the better of the two seconds, or the worse of the two bests.
        second = tl.maximum(tl.maximum(second, chunk_second), tl.minimum(best, chunk_best))
        grows = chunk_best > best        # strictly: a tie keeps the earlier (first) index
        new_best = tl.maximum(best, chunk_best)
        shift = tl.where(new_best == neg_inf, 0.0, new_best)
        total = total * tl.exp(best - shift) + tl.sum(tl.exp(x - shift), axis=0)
        best_at = tl.where(grows, chunk_at, best_at)
        best = new_best
    log_total = tl.log(total)
    logprob = (best - best) - log_total
    gap = logprob - ((second - best) - log_total)
    token = best_at
    if HAS_D2T:
        token = best_at + tl.load(d2t_ptr + best_at)
    col = tl.load(column_ptr + row * column_stride)
    inside = (col >= 0) & (col < width)      # a column past the outputs writes nothing (scatter_ would raise)
    tl.store(tokens_ptr + row, token)
    tl.store(out_tokens_ptr + row * tokens_stride + col, token, mask=inside)
    tl.store(logprobs_ptr + row * logprobs_stride + col, logprob, mask=inside)
    tl.store(gaps_ptr + row * gaps_stride + col, gap, mask=inside)


def greedy_draft(logits: torch.Tensor, d2t: torch.Tensor | None, column: torch.Tensor, tokens_out: torch.Tensor,
                 logprobs_out: torch.Tensor, gaps_out: torch.Tensor) -> torch.Tensor:
    """Of `logits` [n, V] fp32: the tokens [n] int64 (returned, and stored at each row's `column` [n, 1] of
    `tokens_out` [n, K]), their log-probabilities and top-2 gaps (at the same column of `logprobs_out` and
    `gaps_out`, [n, K] fp32); every output's last dimension contiguous."""
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        _greedy_draft_kernel[(rows,)](logits, logits.stride(0), d2t if d2t is not None else tokens, column,
                                      column.stride(0), tokens, tokens_out, tokens_out.stride(0), logprobs_out,
                                      logprobs_out.stride(0), gaps_out, gaps_out.stride(0), vocab, tokens_out.shape[1],
                                      HAS_D2T=d2t is not None, BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
                                      num_warps=8)
    return tokens
