"""Attention metadata: padding is inert, draft steps advance in place, padded forwards write no KV."""

from __future__ import annotations

import inspect

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import engine_config
from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PAD_SLOT, PagedKVCache
from parity.engine.metadata import MetadataBuilder, RowPlan
from parity.engine.proposer import EagleProposer
from parity.engine.target_runner import TargetRunner

MAX_TOKENS, MAX_REQS = 48, 6
GARBAGE = 777   # what the buffers hold before a build: any stale entry shows


def make_builder(block_size: int, max_model_len: int, sliding_window: int = 0) -> MetadataBuilder:
    blocks_per_seq = -(-max_model_len // block_size)
    buffers = InputBuffers("test", torch.device("cpu"))
    register_attention_buffers(buffers, MAX_TOKENS, MAX_REQS, blocks_per_seq)
    for _, t in buffers.items():
        t.fill_(GARBAGE)
    kv = PagedKVCache(1, MAX_REQS * blocks_per_seq, block_size, 1, 4, torch.float32, torch.device("cpu"))
    return MetadataBuilder(buffers, kv, block_size, max_model_len, sliding_window,
                           (0,) if sliding_window else ())


def advance(builder: MetadataBuilder, meta, num_reqs_padded: int) -> None:
    """`advance_draft_step`, whichever of its two signatures (with or without the metadata) it has."""
    if len(inspect.signature(builder.advance_draft_step).parameters) == 2:
        builder.advance_draft_step(meta, num_reqs_padded)
    else:
        builder.advance_draft_step(num_reqs_padded)


def slot(blocks, position, block_size, max_model_len):
    if position >= max_model_len:
        return PAD_SLOT
    return blocks[position // block_size] * block_size + position % block_size


@st.composite
def batches(draw, one_token: bool = False):
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.sampled_from([16, 40, 64]))
    blocks_per_seq = -(-max_model_len // block_size)
    num_reqs = draw(st.integers(1, 4))
    # Distinct, shuffled blocks per request, enough to cover max_model_len.
    pool = draw(st.permutations(range(MAX_REQS * blocks_per_seq)))
    rows = []
    for i in range(num_reqs):
        blocks = list(pool[i * blocks_per_seq:(i + 1) * blocks_per_seq])
        qlen = 1 if one_token else draw(st.integers(1, 8))
        first = draw(st.integers(0, max_model_len - (1 if one_token else qlen)))
        rows.append(RowPlan(100 + i, draw(st.lists(st.integers(0, 96), min_size=qlen, max_size=qlen)), first, blocks))
    num_tokens = sum(r.query_len for r in rows)
    tokens_padded = num_tokens + draw(st.integers(0, 8))
    reqs_padded = num_reqs + draw(st.integers(0, MAX_REQS - num_reqs))
    if one_token:
        tokens_padded = reqs_padded
    return block_size, max_model_len, rows, tokens_padded, reqs_padded


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batches())
def test_build_writes_rows_and_inert_padding(batch):
    block_size, max_model_len, rows, tp, rp = batch
    b = make_builder(block_size, max_model_len)
    meta = b.build(rows, tp, rp)
    T, R = sum(r.query_len for r in rows), len(rows)

    positions = [p for r in rows for p in range(r.first_position, r.seq_len)]
    assert meta.positions.tolist() == positions + [0] * (tp - T)
    assert meta.slot_mapping.tolist() == [slot(r.blocks, p, block_size, max_model_len)
                                          for r in rows for p in range(r.first_position, r.seq_len)] \
        + [PAD_SLOT] * (tp - T)
    assert meta.seq_lens.tolist() == [r.seq_len for r in rows] + [0] * (rp - R)
    qsl = [0]
    for r in rows:
        qsl.append(qsl[-1] + r.query_len)
    assert meta.query_start_loc.tolist() == qsl + [T] * (rp - R)
    assert b.buffers["input_ids"][:tp].tolist() == [t for r in rows for t in r.token_ids] + [0] * (tp - T)
    for i, r in enumerate(rows):
        assert meta.block_table[i, : len(r.blocks)].tolist() == r.blocks
    assert (meta.block_table[R:] == 0).all()
    assert (meta.num_reqs, meta.num_actual_tokens) == (R, T)
    assert meta.max_query_len == max(r.query_len for r in rows)
    assert meta.max_seq_len == max(r.seq_len for r in rows)
    # The metadata is a view of the persistent buffers, not a copy.
    for name in ("positions", "slot_mapping", "seq_lens", "query_start_loc", "block_table"):
        assert getattr(meta, name).data_ptr() == b.buffers[name].data_ptr(), name
    assert meta.seq_lens.shape == (rp,) and meta.query_start_loc.shape == (rp + 1,)
    assert meta.slot_mapping.shape == (tp,) and meta.positions.shape == (tp,)


def test_build_dummy_is_all_padding():
    b = make_builder(4, 64)
    meta = b.build_dummy(8, 3)
    assert meta.slot_mapping.tolist() == [PAD_SLOT] * 8
    assert meta.seq_lens.tolist() == [0, 0, 0]
    assert meta.query_start_loc.tolist() == [0, 8, 8, 8]
    assert meta.positions.tolist() == [0] * 8
    assert (meta.block_table == 0).all()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(batches(one_token=True), st.integers(1, 6), st.sampled_from([0, 3]))
def test_advance_draft_step_equals_a_fresh_build(batch, steps, window):
    """After m advances a draft-step batch equals the batch built at positions + m, in place."""
    block_size, max_model_len, rows, tp, rp = batch
    live = make_builder(block_size, max_model_len, window)
    meta = live.build(rows, tp, rp, write_input_ids=False)
    ptrs = {name: t.data_ptr() for name, t in live.buffers.items()}
    for m in range(1, steps + 1):
        advance(live, meta, rp)
        moved = [RowPlan(r.req_id, r.token_ids, r.first_position + m, r.blocks) for r in rows]
        fresh = make_builder(block_size, max_model_len, window).build(moved, tp, rp)
        for name in ("positions", "seq_lens", "slot_mapping", "window_start"):
            got, want = getattr(meta, name).tolist(), getattr(fresh, name).tolist()
            assert got == want, f"{name} after {m} advance(s): {got} != {want}"
            # The live buffer (what a graph captured) holds the same values.
            assert live.buffers[name][: len(got)].tolist() == want, name
        # Rows past the end stay clamped at the last position with a PAD slot.
        for i, r in enumerate(rows):
            if r.first_position + m >= max_model_len:
                assert meta.positions[i] == max_model_len - 1
                assert meta.slot_mapping[i] == PAD_SLOT
                assert meta.seq_lens[i] == max_model_len
        assert (meta.seq_lens[len(rows):] == 0).all() and (meta.slot_mapping[len(rows):] == PAD_SLOT).all()
    assert {name: t.data_ptr() for name, t in live.buffers.items()} == ptrs, "advance must work in place"


# --- a padded forward writes no real KV slot ---------------------------------------------

def _randomise(kv) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    for t in kv.tensors():
        t.copy_(torch.randn(t.shape, generator=gen))
    return kv.snapshot()


def _changed_rows(kv, saved) -> set[int]:
    rows = set()
    for live, old in zip(kv.tensors(), saved):
        diff = (live != old).flatten(1).any(dim=1)
        rows |= set(torch.nonzero(diff).flatten().tolist())
    return rows


def test_padded_target_forward_writes_only_real_slots(random_pair):
    target, _ = random_pair
    cfg = engine_config(block_size=4, max_num_seqs=4)
    runner = TargetRunner(target, cfg, torch.device("cpu"))
    kv = runner.kv_cache
    trash = kv.keys[0].shape[0] - 1
    rows = [RowPlan(0, [5, 6, 7], 0, [3, 9]), RowPlan(1, [8, 9, 10, 11], 6, [4, 5, 6])]
    real = {slot(r.blocks, p, 4, cfg.max_model_len) for r in rows for p in range(r.first_position, r.seq_len)}

    saved = _randomise(kv)
    meta = runner.builder.build(rows, 16, 4)          # 7 real tokens padded to 16, 2 rows to 4
    with torch.no_grad():
        padded_logits, _ = runner.verify(16, 4, meta)
    assert _changed_rows(kv, saved) - {trash} == real
    written = [t[sorted(real)].clone() for t in kv.tensors()]

    # Padded rows produce finite outputs (no NaN from an all-masked softmax).
    assert torch.isfinite(padded_logits).all()

    # Unpadded, the real tokens get the same logits and write the same KV.
    kv.restore(saved)
    meta = runner.builder.build(rows, 7, 2)
    with torch.no_grad():
        exact_logits, _ = runner.verify(7, 2, meta)
    torch.testing.assert_close(padded_logits[:7], exact_logits, rtol=1e-5, atol=1e-5)
    for t, w in zip(kv.tensors(), written):
        torch.testing.assert_close(t[sorted(real)], w, rtol=1e-5, atol=1e-6)

    # All padding (capture-time metadata): nothing but the trash row changes.
    kv.restore(saved)
    meta = runner.builder.build_dummy(16, 4)
    with torch.no_grad():
        runner.verify(16, 4, meta)
    assert _changed_rows(kv, saved) <= {trash}


def test_padded_draft_step_writes_only_real_slots(random_pair):
    target, head = random_pair
    cfg = engine_config(block_size=4, max_num_seqs=4)
    proposer = EagleProposer(head, cfg, torch.device("cpu"))
    kv = proposer.kv_cache
    trash = kv.keys[0].shape[0] - 1
    rows = [RowPlan(0, [0], 9, [3, 9, 11]), RowPlan(1, [0], 2, [4])]
    real = {slot(r.blocks, r.first_position, 4, cfg.max_model_len) for r in rows}
    saved = _randomise(kv)
    proposer.buffers["hidden_states"].normal_()
    proposer.buffers["draft_step"].fill_(1)
    meta = proposer.builder.build(rows, 4, 4)
    with torch.no_grad():
        proposer.step_forward(4, 4, meta)
    assert _changed_rows(kv, saved) - {trash} == real
    advance(proposer.builder, meta, 4)
    moved = {slot(r.blocks, r.first_position + 1, 4, cfg.max_model_len) for r in rows}
    saved = kv.snapshot()
    with torch.no_grad():
        proposer.step_forward(4, 4, meta)
    assert _changed_rows(kv, saved) - {trash} == moved
