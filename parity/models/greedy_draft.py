"""A greedy draft step's sampling as one op: the drawn token, its log-probability and the top-2 gap.

Greedy drafting reduces each drafted row's logits four times: the argmax (the
token), the log-softmax and its gather (the token's log-probability), the
maximum and the maximum with the first one masked (the gap the records keep).
In torch those are about ten kernels of one row each, and on an 8B draft step
they and the replay's gaps between them were a fifth of its time. As one
custom op it is one Triton kernel on CUDA (`triton_greedy_draft`): a program
per row, one pass over the row, which also stores the three values at the
draft step's column of the drafter's output buffers (three scatters fewer).
Its torch implementation is the ops the proposer ran before, op for op, and
the CPU and the emulated backend run it; as a capture records it, the op
writes the three output buffers (`mutates_args`) and returns the tokens.

The two implementations agree on the token (the first maximum, as argmax) and
on the gap's ties (0); the log-probability and gap are each the same formula
but summed in another order, so their last bits may differ between the
kernel and torch. Nothing compares the two: every mode and every reference of
a run call the same op, and each row's result depends on that row alone, so a
graph replay at a padded shape gives its real rows the bits an eager call
gives them (`tests/test_gpu_greedy_draft.py`).
"""

from __future__ import annotations

import torch

from parity.models.direct_op import DirectOp
from parity.models.fused_ops import HAS_TRITON


def top_gap(logprobs: torch.Tensor) -> torch.Tensor:
    """The best log-probability minus the second best, per row: [n, V] -> [n, 1].

    The values `topk(2)` gives, in four kernels where its radix select over the vocabulary takes about twenty:
    the maximum, then the maximum with the first maximum's element masked (a tie for first gives a gap of 0, as
    topk's does).
    """
    best, where = logprobs.max(dim=-1, keepdim=True)
    return best - logprobs.scatter(-1, where, float("-inf")).amax(dim=-1, keepdim=True)


def _torch_greedy_draft(logits: torch.Tensor,
                        d2t: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of `logits` [n, V] fp32: (the argmax as a target id [n] int64, mapped through `d2t` (a draft
    vocabulary's offsets, [V] int64) when given, its log-softmax [n, 1] fp32, the top-2 log-probability gap
    [n, 1] fp32)."""
    drawn = logits.argmax(-1)
    tokens = drawn if d2t is None else drawn + d2t[drawn]
    all_logprobs = torch.log_softmax(logits, dim=-1)
    return tokens, all_logprobs.gather(1, drawn.unsqueeze(1)), top_gap(all_logprobs)


def _torch_greedy_draft_into(logits: torch.Tensor, d2t: torch.Tensor | None, column: torch.Tensor,
                             tokens_out: torch.Tensor, logprobs_out: torch.Tensor,
                             gaps_out: torch.Tensor) -> torch.Tensor:
    """`_torch_greedy_draft`'s three values written at each row's `column` ([n, 1] int64) of the [n, K] outputs
    `tokens_out`, `logprobs_out` and `gaps_out`; returns the tokens [n] (the next draft step's input ids)."""
    tokens, logprobs, gaps = _torch_greedy_draft(logits, d2t)
    tokens_out.scatter_(1, column, tokens.unsqueeze(1))
    logprobs_out.scatter_(1, column, logprobs)
    gaps_out.scatter_(1, column, gaps)
    return tokens


greedy_draft = DirectOp("parity::greedy_draft", _torch_greedy_draft_into,
                        mutates_args=("tokens_out", "logprobs_out", "gaps_out"))


if HAS_TRITON:
    @greedy_draft.register_kernel("cuda")
    def _(logits, d2t, column, tokens_out, logprobs_out, gaps_out):
        outs = (tokens_out, logprobs_out, gaps_out)
        if not (logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1 and logits.shape[1]
                and (d2t is None or (d2t.dtype == torch.int64 and d2t.is_contiguous()))
                and column.dim() == 2 and column.dtype == torch.int64
                and all(o.dim() == 2 and o.stride(1) == 1 and o.shape == tokens_out.shape for o in outs)
                and tokens_out.shape[0] == logits.shape[0] and column.shape[0] == logits.shape[0]
                and tokens_out.dtype == torch.int64
                and logprobs_out.dtype == gaps_out.dtype == torch.float32):
            return _torch_greedy_draft_into(logits, d2t, column, tokens_out, logprobs_out, gaps_out)
        from parity.models import triton_greedy_draft
        return triton_greedy_draft.greedy_draft(logits, d2t, column, tokens_out, logprobs_out, gaps_out)
