"""The draft records' top-2 gap equals what torch.topk(2) gives, ties and masked vocabularies included."""

import torch

from parity.engine.proposer import _top_gap


def test_top_gap_is_topk_values():
    g = torch.Generator().manual_seed(0)
    for trial in range(500):
        rows, vocab = 1 + trial % 4, 2 + trial % 50
        x = torch.randint(-3, 3, (rows, vocab), generator=g).float()     # small integers: many ties
        if trial % 7 == 0:
            x[:, ::2] = float("-inf")                                      # a draft vocabulary inside the target's
        top = x.topk(2, dim=-1).values
        assert torch.equal(_top_gap(x), top[:, :1] - top[:, 1:]), x
