"""The greedy draft step's sampling op: the token, its log-probability and the top-2 gap, as the proposer took them.

The top-2 gap equals what torch.topk(2) gives, ties and masked vocabularies
included; the op's torch implementation (the CPU's and the emulated
backend's) is argmax, log_softmax, gather and that gap bit for bit, called
directly or through the dispatcher (as a graph capture sees it).
"""

import torch

from parity.models.greedy_draft import greedy_draft, top_gap
from tests.dispatch_log import Seen


def _logits(trial: int, g: torch.Generator) -> torch.Tensor:
    rows, vocab = 1 + trial % 4, 2 + trial % 50
    x = torch.randint(-3, 3, (rows, vocab), generator=g).float()     # small integers: many ties
    if trial % 7 == 0:
        x[:, ::2] = float("-inf")                                      # a draft vocabulary inside the target's
    return x


def test_top_gap_is_topk_values():
    g = torch.Generator().manual_seed(0)
    for trial in range(500):
        x = _logits(trial, g)
        top = x.topk(2, dim=-1).values
        assert torch.equal(top_gap(x), top[:, :1] - top[:, 1:]), x


def _outputs(rows: int, width: int):
    return (torch.full((rows, width), -7, dtype=torch.int64), torch.full((rows, width), -7.0),
            torch.full((rows, width), -7.0))


def test_greedy_draft_is_the_proposers_torch_ops():
    """The op stores at each row's column what argmax, log_softmax's gather and `top_gap` give, touches no other
    column, and returns the tokens."""
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        x = _logits(trial, g) + torch.rand(1, generator=g)
        rows, width = x.shape[0], 1 + trial % 4
        d2t = torch.randint(0, 9, (x.shape[1],), generator=g) if trial % 2 else None
        column = torch.randint(0, width, (1, 1), generator=g).expand(rows, 1)
        drawn = x.argmax(-1)
        all_logprobs = torch.log_softmax(x, dim=-1)
        tokens = drawn if d2t is None else drawn + d2t[drawn]
        want = _outputs(rows, width)
        for out, value in zip(want, (tokens.unsqueeze(1), all_logprobs.gather(1, drawn.unsqueeze(1)),
                                     top_gap(all_logprobs))):
            out.scatter_(1, column, value)
        observed = _outputs(rows, width)
        with Seen() as seen:
            returned = greedy_draft(x, d2t, column, *observed)
        assert seen.ops == ["parity.greedy_draft.default"]      # one op, as a capture records it
        direct = _outputs(rows, width)
        for got, back in ((observed, returned), (direct, greedy_draft(x, d2t, column, *direct))):
            assert torch.equal(back, tokens)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want)), (x, d2t)
