"""Chunked prefill: prompts longer than the token budget are prefilled over several steps.

The scheduler gives a prefill what is left of `max_num_batched_tokens` after
the running decodes; only the batch's last prefill row may stop short of its
prompt's end, and nothing is sampled or drafted for it. The target's and the
drafter's KV caches fill chunk by chunk, so the output is the same as with the
whole prompt in one step, and graph modes stay bit for bit equal to their
padded references.
"""

from __future__ import annotations

import pytest

from conftest import by_token, engine_config, make_specs
from parity.analysis.reference_parity import reference_parity
from parity.engine.kv_cache import BlockAllocator
from parity.engine.requests import Request, Scheduler
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.factory import install_graphs, install_padded_reference

K = 3
SPECS = make_specs(5, seed=11, max_tokens=10, min_prompt=20, max_prompt=60, stagger=2)


def test_only_the_last_prefill_row_is_partial_and_chunks_cover_the_prompt():
    reqs = [Request(i, list(range(1, 40 + i)), 8, 0) for i in range(3)]
    sched = Scheduler(reqs, max_num_seqs=3, max_num_batched_tokens=32, allocator=BlockAllocator(64, 4),
                      positions_ahead=8, max_model_len=128)
    seen = {r.req_id: [] for r in reqs}
    for step in range(12):
        rows = sched.schedule(step)
        assert sum(len(r.query) for r in rows) <= 32
        assert all(not r.partial for r in rows[:-1]), "a partial prefill row is always the batch's last"
        for row in rows:
            if row.is_prefill:
                assert row.chunk_start == row.request.num_computed
                seen[row.request.req_id].append((row.chunk_start, row.chunk_end))
                row.request.num_computed = row.chunk_end
    for req in reqs:
        spans = seen[req.req_id]
        assert spans[0][0] == 0 and spans[-1][1] == len(req.prompt)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "chunks tile the prompt in order"


def test_chunked_prefill_emits_what_a_whole_prefill_emits(random_pair):
    whole = SpecDecodeEngine(*random_pair, engine_config(max_num_batched_tokens=128, max_model_len=96)).run(SPECS)
    chunked_cfg = engine_config(max_num_batched_tokens=16, max_model_len=96)
    chunked = SpecDecodeEngine(*random_pair, chunked_cfg).run(SPECS)
    assert chunked.outputs == whole.outputs
    assert (chunked.forwards.num_tokens <= 16).all()
    assert chunked.num_steps > whole.num_steps, "the long prompts really were split"
    assert chunked.free_blocks_at_end == chunked.total_blocks
    assert len(by_token(chunked)) == len(by_token(whole))


@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_graphs_stay_bitwise_equal_to_their_reference_with_chunked_prefill(random_pair, mode):
    cfg = engine_config(max_num_batched_tokens=16, max_model_len=96)
    graphs = SpecDecodeEngine(*random_pair, cfg)
    install_graphs(graphs, mode, "emulated")
    reference = SpecDecodeEngine(*random_pair, cfg)
    install_padded_reference(reference, mode, poison=True)
    a, b = graphs.run(SPECS), reference.run(SPECS)
    assert reference_parity(a, b, "ref").bitwise_equal
    assert set(a.forwards.runtime_mode) & {"full", "piecewise"}
