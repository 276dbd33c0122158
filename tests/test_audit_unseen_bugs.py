"""parity.audit on mistakes written after the audit, against examples/gpt_fast (not among its planted bugs).

Each is a one-line change a user could make, tried as a user would (`audited_generate`, nothing told where
to look):
- the KV cache rebound after capture to a view of a larger fresh tensor (at offset 0, or further in): the
  graph keeps writing the old cache. The redirect experiment places what the graph wrote through the captured
  tensor where eager writes the live view, so it is named BUFFER_REASSIGNED as a whole new cache is (it was
  CAPTURE_CONTEXT, the storages' sizes differing, before `lab.placed`);
- the draft's body slicing its output by a Python count of live rows: frozen at capture;
- padded rows refreshed for the live rows only, so padded entries keep the previous batch's cache rows (a
  live request's, once requests shift down): padding that is not inert.
"""

from __future__ import annotations

import pytest
import torch

from examples.gpt_fast import Engine, audited_generate
from examples.gpt_fast.engine import Batch

PROMPTS, MAX_NEW = [5, 9, 17], [8, 5, 2]


class CacheAsView(Engine):
    offset = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cache = self.target.layers[1].cache
        rows = cache.v.shape[0]
        larger = torch.zeros((2 * rows, *cache.v.shape[1:]), dtype=cache.v.dtype, device=cache.v.device)
        cache.v = larger[self.offset: self.offset + rows]        # BUG: the graph keeps the captured cache


class CacheAsLaterView(CacheAsView):
    offset = 3


class SlicedByHostCount(Engine):
    def draft_step(self, bs):
        return super().draft_step(bs)[: max(self.num_valid, 1)]  # BUG: num_valid is read once, at capture


class PaddedRowsLeftOver(Engine):
    def _run(self, fn, graph_entry, batch, bs, refresh_positions=True):
        if graph_entry is not None:                             # BUG: padded rows keep the last batch's rows
            rows = batch.rows.clone()
            rows[self.num_valid:bs] = self.static.rows[self.num_valid:bs]
            batch = Batch(batch.tokens, batch.positions, rows, batch.step)
        return super()._run(fn, graph_entry, batch, bs, refresh_positions)


CASES = {
    CacheAsView: ("BUFFER_REASSIGNED", "self.target.layers.1.cache.v"),
    CacheAsLaterView: ("BUFFER_REASSIGNED", "self.target.layers.1.cache.v"),
    SlicedByHostCount: ("FROZEN_AT_CAPTURE", "self.num_valid"),
    PaddedRowsLeftOver: ("PADDING_LEAK", "self.static.rows"),
}


def check(engine_class, device: str) -> None:
    kind, buffer = CASES[engine_class]
    session, _, _ = audited_generate(lambda: engine_class(device), PROMPTS, MAX_NEW)
    assert session.errors, "nothing found"
    found = session.errors[0]
    assert (found.kind, found.buffers[0]) == (kind, buffer), (found.kind, found.buffers, found.diagnosis["evidence"])


@pytest.mark.parametrize("engine_class", list(CASES), ids=lambda c: c.__name__)
def test_an_unseen_bug_is_named(engine_class):
    check(engine_class, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("engine_class", list(CASES), ids=lambda c: c.__name__)
def test_an_unseen_bug_is_named_on_cuda(engine_class):
    check(engine_class, "cuda")
