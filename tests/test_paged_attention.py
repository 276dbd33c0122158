"""Paged attention against a naive per-request reference, its memory bound, and its capture.

Each case builds real metadata (MetadataBuilder) over shuffled, non-contiguous
blocks, fills the KV cache with finite garbage (so an unmasked key shows) and
the trash row with NaN (so a gather of it shows), writes each request's
context prefix, and poisons padded tokens' q/k/v with NaN. The reference is
softmax(q k^T * scale) v over each token's own keys, in float64.

Tolerances: fp32 must match to 1e-5 relative (1e-6 absolute). bf16 inputs are
compared with the float64 reference of the same bf16 values: all maths runs in
fp32 and the output is rounded to bf16 once (half an ulp, 2^-9 relative), so
2^-7 relative and 2^-9 absolute leave room for fp32 summation noise only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder, RowPlan
from parity.graphs.capture import capture
from parity.graphs.emulated import EmulatedBackend
from parity.models import attention_tiles, paged_attention
from parity.models.attention_tiles import plan_tiles, tile_map
from parity.models.paged_attention import attention_core, one_forward

SCALE = 0.37
SMALLEST = 0   # a chunk budget of 0 bytes: one block per chunk, so many chunks
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2 ** -7, atol=2 ** -9)}


@contextlib.contextmanager
def chunk_budget(budget: int | None):
    """Run with `attention_tiles.CHUNK_BUDGET_BYTES` set to `budget` (None: the default)."""
    saved = attention_tiles.CHUNK_BUDGET_BYTES
    if budget is not None:
        attention_tiles.CHUNK_BUDGET_BYTES = budget
    try:
        yield
    finally:
        attention_tiles.CHUNK_BUDGET_BYTES = saved


@dataclass
class Case:
    builder: MetadataBuilder
    meta: object
    kv: PagedKVCache
    query: torch.Tensor         # [1, H, T_pad, D]
    key: torch.Tensor           # [1, KVH, T_pad, D]
    value: torch.Tensor
    rows: list                  # (first_position, qlen, keys [seq_len, KVH, D], values)
    window: int
    num_tokens: int             # real tokens


def make_case(rows_spec, block_size=4, max_model_len=40, kv_heads=2, groups=2, head_dim=8,
              dtype=torch.float32, window=0, pad_tokens=0, pad_rows=0, seed=0, device="cpu") -> Case:
    """Requests (first_position, qlen) with their whole context in history, the prefix already cached.

    Everything the engine would hold (cache, metadata, q/k/v) lives on `device`;
    the rows' keys and values, which the reference reads, stay on the CPU.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    heads = kv_heads * groups
    needed = [-(-(f + q) // block_size) for f, q in rows_spec]
    num_blocks = sum(needed) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()   # shuffled, non-contiguous blocks
    kv = PagedKVCache(1, num_blocks, block_size, kv_heads, head_dim, dtype, device)
    for cache in kv.tensors():
        cache.copy_(torch.randn(cache.shape, generator=gen) * 3)   # garbage a masked key must not reach
        cache[-1] = float("nan")                                   # no gather may touch the trash row
    rows, plans, q_parts, k_parts, v_parts = [], [], [], [], []
    for i, (first, qlen) in enumerate(rows_spec):
        blocks, order = order[: needed[i]], order[needed[i]:]
        keys = torch.randn(first + qlen, kv_heads, head_dim, generator=gen).to(dtype)
        values = torch.randn(first + qlen, kv_heads, head_dim, generator=gen).to(dtype)
        for j in range(first):
            slot = blocks[j // block_size] * block_size + j % block_size
            kv.keys[0][slot], kv.values[0][slot] = keys[j], values[j]
        rows.append((first, qlen, keys, values))
        plans.append(RowPlan(i, [0] * qlen, first, blocks))
        q_parts.append(torch.randn(qlen, heads, head_dim, generator=gen).to(dtype))
        k_parts.append(keys[first:])
        v_parts.append(values[first:])
    num_tokens = sum(q for _, q in rows_spec)
    tokens_padded, reqs_padded = num_tokens + pad_tokens, len(rows_spec) + pad_rows
    nan = float("nan")
    # [T, heads, D] then transposed, as transformers hands q/k/v over after RoPE.
    q = torch.cat(q_parts + [torch.full((pad_tokens, heads, head_dim), nan, dtype=dtype)])
    k = torch.cat(k_parts + [torch.full((pad_tokens, kv_heads, head_dim), nan, dtype=dtype)])
    v = torch.cat(v_parts + [torch.full((pad_tokens, kv_heads, head_dim), nan, dtype=dtype)])
    q, k, v = q.to(device), k.to(device), v.to(device)
    buffers = InputBuffers("test", device)
    register_attention_buffers(buffers, tokens_padded, reqs_padded, -(-max_model_len // block_size))
    builder = MetadataBuilder(buffers, kv, block_size, max_model_len, window, (0,) if window else ())
    meta = builder.build(plans, tokens_padded, reqs_padded)
    return Case(builder, meta, kv, q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                v.transpose(0, 1).unsqueeze(0), rows, window, num_tokens)


def reference(case: Case) -> torch.Tensor:
    """[T_pad, H, D] in float64: each token over its own request's keys; padded tokens 0.

    Keys j with lo <= j <= min(position, seq_len - 1), seq_len as the metadata says
    (a stale seq_lens shortens the context); a token with no such key gets 0.
    """
    heads, tokens_padded, head_dim = case.query.shape[1:]
    kv_heads = case.key.shape[1]
    groups = heads // kv_heads
    out = torch.zeros(tokens_padded, heads, head_dim, dtype=torch.float64)
    t = 0
    for row, (first, qlen, keys, values) in enumerate(case.rows):
        for i in range(qlen):
            pos = first + i
            lo = max(0, pos - case.window + 1) if case.window else 0
            hi = min(pos, int(case.meta.seq_lens[row]) - 1)
            for h in range(heads if hi >= lo else 0):
                q = case.query[0, h, t].double().cpu()
                k = keys[lo:hi + 1, h // groups].double()
                v = values[lo:hi + 1, h // groups].double()
                out[t, h] = torch.softmax(k @ q * SCALE, dim=0) @ v
            t += 1
    return out


def run(case: Case) -> torch.Tensor:
    with torch.no_grad():
        out, _ = paged_attention.paged_attention(SimpleNamespace(layer_idx=0), case.query, case.key, case.value, None,
                                 scaling=SCALE, paged=case.meta)
    return out[0]


def check(case: Case, budget=None, tolerance=None) -> None:
    before = [t.clone() for t in case.kv.tensors()]
    with chunk_budget(budget):
        out = run(case)
    dtype = case.query.dtype
    assert out.dtype == dtype and out.shape == (case.query.shape[2], case.query.shape[1], case.query.shape[3])
    expected = reference(case)
    n = case.num_tokens
    torch.testing.assert_close(out[:n].double().cpu(), expected[:n], **(tolerance or TOLERANCE[dtype]))
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padded tokens must output exactly 0"
    # Only the real tokens' slots changed (and the trash row took the padded writes).
    slots = case.meta.slot_mapping[:n]
    for old, new, written in ((before[0], case.kv.keys[0], case.key), (before[1], case.kv.values[0], case.value)):
        assert torch.equal(new[slots], written[0, :, :n].transpose(0, 1))
        untouched = torch.ones(new.shape[0] - 1, dtype=torch.bool, device=new.device)
        untouched[slots] = False
        assert torch.equal(new[:-1][untouched], old[:-1][untouched])


# Prefill from 0, a prefill chunk starting mid-sequence, a decode, a verify of 1+K.
MIXED = [(0, 7), (9, 5), (20, 1), (13, 4)]


@pytest.mark.parametrize("budget", [None, SMALLEST], ids=["one-chunk", "block-chunks"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_mixed_batch_matches_reference(groups, window, budget):
    check(make_case(MIXED, groups=groups, window=window, pad_tokens=3, pad_rows=2, seed=groups), budget)


@pytest.mark.parametrize("budget", [None, SMALLEST], ids=["one-chunk", "block-chunks"])
def test_bf16_matches_fp32_reference_within_rounding(budget):
    check(make_case(MIXED, dtype=torch.bfloat16, window=6, pad_tokens=2, pad_rows=1, seed=5), budget)


def test_long_context_over_many_chunks():
    """113 positions of context (29 blocks) walked one block per chunk: 32 chunks of online softmax."""
    case = make_case([(110, 3), (57, 1), (0, 9)], block_size=4, max_model_len=128, groups=4, pad_tokens=1, seed=3)
    assert len(plan_tiles(13, 3, 8, 2, 8, 4, 4, 128, 32, budget=SMALLEST).chunks) == 32
    check(case, SMALLEST)


@pytest.mark.parametrize("qlen", [1, 4])
def test_uniform_decode_batch(qlen):
    """Draft steps (1 token) and verification (1+K) of 6 requests, padded in whole requests."""
    rows = [(3 + 5 * i, qlen) for i in range(6)]
    check(make_case(rows, groups=4, pad_tokens=2 * qlen, pad_rows=2, seed=qlen), SMALLEST)


@pytest.mark.parametrize("budget", [None, SMALLEST], ids=["one-chunk", "block-chunks"])
def test_keys_at_or_past_seq_len_are_masked(budget):
    """seq_lens bounds the context even where positions say more (a stale or rebound seq_lens)."""
    case = make_case(MIXED, window=0, pad_tokens=1, seed=13)
    case.meta.seq_lens[1] = 11          # row 1 sits at positions 9..13: its later tokens lose keys
    case.meta.seq_lens[3] = 0           # row 3 has no key at all: output 0, not NaN
    check(case, budget)
    out = run(case)
    assert not torch.isnan(out).any()
    assert torch.equal(out[13:17], torch.zeros_like(out[13:17]))


def test_worst_case_tiling_fits_the_static_bound():
    """Rows of 1, 1, 1 and 13 tokens: ceil(16/4) = 4-token tiles, 7 of them, the bound exactly."""
    case = make_case([(5, 1), (0, 1), (30, 1), (2, 13)], groups=2, seed=17)
    plan = plan_tiles(16, 4, 4, 2, 8, 4, 4, 40, 10)
    assert (plan.tile_len, plan.num_tiles) == (4, 7)
    check(case)


def test_capture_time_metadata_is_all_padding():
    """build_dummy: every token padding; outputs 0, no NaN, nothing but the trash row written."""
    case = make_case([(4, 3)], pad_tokens=5, pad_rows=2, seed=7)
    case.meta = case.builder.build_dummy(8, 3)
    before = [t.clone() for t in case.kv.tensors()]
    out = run(case)
    assert torch.equal(out, torch.zeros_like(out))
    for old, new in zip(before, case.kv.tensors()):
        assert torch.equal(new[:-1], old[:-1])


def test_same_inputs_same_bits():
    case = make_case(MIXED, window=5, pad_tokens=3, seed=11)
    with chunk_budget(SMALLEST):
        first, second = run(case), run(case)
    assert torch.equal(first, second)


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def layered(case: Case, layers: int) -> tuple[list[torch.Tensor], list[int]]:
    """`layers` attention calls on the same metadata inside one forward: outputs and ops each dispatched."""
    outs, ops = [], []
    with one_forward(), torch.no_grad():
        for layer in range(layers):
            with OpCounter() as counter:
                outs.append(attention_core(SimpleNamespace(layer_idx=layer), case.query, case.key, case.value,
                                           SCALE, case.meta))
            ops.append(counter.ops)
    return outs, ops


@pytest.mark.parametrize("budget", [None, SMALLEST], ids=["one-chunk", "block-chunks"])
def test_layers_of_one_forward_share_the_layout_bitwise(budget):
    """Layer 2 and 3 reuse layer 1's tile map, indices and masks: same bits as computing them alone, fewer ops."""
    case = make_case(MIXED, window=5, pad_tokens=3, pad_rows=2, seed=5)
    case.kv = PagedKVCache(3, case.kv.keys[0].shape[0] // 4, 4, 2, 8, torch.float32, torch.device("cpu"))
    for layer in range(3):
        case.kv.keys[layer].copy_(case.meta.kv_cache.keys[0])
        case.kv.values[layer].copy_(case.meta.kv_cache.values[0])
    case.meta.kv_cache = case.kv
    case.meta.window_layers = (1,)
    with chunk_budget(budget):
        shared, ops = layered(case, 3)
        alone, alone_ops = [], []
        for layer in range(3):      # outside a forward: each call computes the layout itself
            with torch.no_grad(), OpCounter() as counter:
                alone.append(attention_core(SimpleNamespace(layer_idx=layer), case.query, case.key, case.value,
                                            SCALE, case.meta))
            alone_ops.append(counter.ops)
    for layer in range(3):
        assert torch.equal(shared[layer], alone[layer]), f"layer {layer}"
    assert ops[0] == alone_ops[0] and ops[1] < alone_ops[1] and ops[2] < alone_ops[2], (ops, alone_ops)


def test_a_layout_never_outlives_its_forward():
    """Draft steps update the metadata in place between forwards: the next forward must see the new values."""
    case = make_case([(3, 1), (9, 1)], pad_rows=1, seed=8)
    first, _ = layered(case, 1)
    case.meta.seq_lens[0] -= 2          # a stale-looking context for row 0: fewer keys
    second, _ = layered(case, 1)
    assert not torch.equal(first[0][0, 0], second[0][0, 0])
    assert torch.equal(first[0][0, 1], second[0][0, 1])
    torch.testing.assert_close(second[0][0].double(), reference(case), **TOLERANCE[torch.float32])


@st.composite
def batches(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(4, 48))
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        qlen = draw(st.integers(1, min(9, max_model_len)))
        rows.append((draw(st.integers(0, max_model_len - qlen)), qlen))
    return dict(rows_spec=rows, block_size=block_size, max_model_len=max_model_len,
                kv_heads=draw(st.sampled_from([1, 2])), groups=draw(st.sampled_from([1, 3, 4])),
                head_dim=draw(st.sampled_from([4, 8])), window=draw(st.sampled_from([0, 1, 3, 8])),
                pad_tokens=draw(st.integers(0, 4)), pad_rows=draw(st.integers(0, 3)),
                seed=draw(st.integers(0, 2 ** 16)))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(batches(), st.sampled_from([None, SMALLEST, 3000]))
def test_random_batches_match_reference(batch, budget):
    check(make_case(**batch), budget)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 12), st.integers(1, 5), st.data())
def test_stale_query_start_loc_never_maps_a_token_twice(num_tokens, num_rows, data):
    """Any query_start_loc (a stale one under a fault): slots stay in bounds, no token is claimed twice."""
    qsl = [0] + data.draw(st.lists(st.integers(0, 3 * num_tokens), min_size=num_rows, max_size=num_rows))
    meta = SimpleNamespace(query_start_loc=torch.tensor(qsl))
    plan = plan_tiles(num_tokens, num_rows, 4, 2, 8, 4, 4, 16, 4)
    tiles = tile_map(meta, plan)
    live = tiles.token[~tiles.idle].tolist()
    assert len(live) == len(set(live)) and all(0 <= t < num_tokens for t in live)
    assert ((tiles.token >= 0) & (tiles.token < num_tokens)).all()
    assert ((tiles.tile_row >= 0) & (tiles.tile_row < num_rows)).all()
    if qsl == sorted(qsl) and qsl[-1] <= num_tokens:
        # Good metadata: every real token has exactly one slot, whatever the split into rows.
        assert sorted(live) == list(range(qsl[-1]))


# --- plans: static shapes from Python ints ------------------------------------------------

def test_plans_at_8b_shapes_cover_the_context_within_the_budget():
    """Llama-3-8B (32 heads, 8 KV heads, bf16, blocks of 16): decode 32 x 4, a 2048-token prefill chunk."""
    decode = plan_tiles(128, 32, 32, 8, 128, 2, 16, 8192, 512)
    prefill = plan_tiles(2048, 32, 32, 8, 128, 2, 16, 8192, 512)
    longer = plan_tiles(2048, 32, 32, 8, 128, 2, 16, 65536, 4096)
    assert (decode.tile_len, decode.num_tiles) == (4, 56)
    assert (prefill.tile_len, prefill.num_tiles) == (64, 63)
    for plan in (decode, prefill, longer):
        assert plan.num_slots <= 2 * plan.num_tokens
        starts = [b for b, _ in plan.chunks]
        assert starts == [sum(n for _, n in plan.chunks[:i]) for i in range(len(starts))]
        assert max(n for _, n in plan.chunks) * 16 * plan.bytes_per_key <= attention_tiles.CHUNK_BUDGET_BYTES
    assert sum(n for _, n in prefill.chunks) == 512 and sum(n for _, n in longer.chunks) == 4096
    # 8x the context: same chunk length, 8x the chunks.
    assert max(n for _, n in longer.chunks) == max(n for _, n in prefill.chunks)
    assert len(longer.chunks) >= 8 * (len(prefill.chunks) - 1)


# --- memory: nothing allocated during attention grows with max_model_len ----------------

class LargestAllocation(TorchDispatchMode):
    """The largest floating-point tensor an op creates (views and in-place results are not new memory).

    Index tensors are left out: the layout holds one int per KV block of each
    tile, a few bytes per block; the working set is what must stay bounded.
    """

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = not any(r.alias_info is not None for r in func._schema.returns)
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if fresh and isinstance(t, torch.Tensor) and t.is_floating_point():
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def test_largest_intermediate_does_not_grow_with_max_model_len(monkeypatch):
    # The torch implementation called directly, so the recorder sees inside the custom op.
    monkeypatch.setattr(paged_attention, "paged_attend", paged_attention.torch_paged_attend)
    sizes = {}
    for max_model_len in (64, 512):
        # Same tokens (two long prefills, a decode); 8x the context they can reach.
        case = make_case([(40, 8), (10, 6), (55, 1)], block_size=4, max_model_len=max_model_len, pad_tokens=1,
                         pad_rows=1, seed=2)
        recorder = LargestAllocation()
        with chunk_budget(40_000), recorder:
            run(case)
        sizes[max_model_len] = recorder.largest
    assert sizes[512] <= sizes[64], sizes
    # And the budget binds: the 64-position context already takes several chunks.
    assert len(plan_tiles(16, 4, 4, 2, 8, 4, 4, 64, 16, budget=40_000).chunks) > 1


# --- capture: a FULL graph of attention replays new metadata bitwise ---------------------

def assert_graph_replays_new_metadata_bitwise(backend, device="cpu", head_dim=8, budget=None) -> None:
    """A FULL graph of attention, captured on one batch, replays three new batches (new metadata in the
    same buffers, new q/k/v) bitwise equal to running attention eagerly on them."""
    layouts = [[(0, 5), (12, 3), (30, 1)], [(7, 2), (3, 6)], [(33, 4), (0, 1), (17, 2)]]
    base = make_case(layouts[0], max_model_len=40, window=4, groups=4, head_dim=head_dim, pad_tokens=2, pad_rows=1,
                     seed=0, device=device)
    tokens_padded, reqs_padded = base.query.shape[2], base.meta.seq_lens.shape[0]
    q, k, v = base.query.clone(), base.key.clone(), base.value.clone()   # the graph's static inputs
    module = SimpleNamespace(layer_idx=0)
    saved = base.kv.snapshot()
    run = lambda: (attention_core(module, q, k, v, SCALE, base.meta),)   # noqa: E731
    with chunk_budget(budget):
        backend.warmup(run)
        graph = capture(backend, backend.new_pool("attn"), run, piecewise=False)
    base.kv.restore(saved)
    for seed, rows_spec in enumerate(layouts[1:] + layouts[:1], start=1):
        # New values into the same buffers (the builder copies), new q/k/v into the captured ones.
        plans, t = [], 0
        gen = torch.Generator().manual_seed(seed)
        free = torch.randperm(base.kv.keys[0].shape[0] // 4, generator=gen).tolist()
        for i, (first, qlen) in enumerate(rows_spec):
            needed = -(-(first + qlen) // 4)
            plans.append(RowPlan(i, [0] * qlen, first, free[:needed]))
            free, t = free[needed:], t + qlen
        meta = base.builder.build(plans, tokens_padded, reqs_padded)
        for static in (q, k, v):
            static.copy_(torch.randn(static.shape, generator=gen))
        before = base.kv.snapshot()
        replayed = graph.replay()[0].clone()
        after_replay = base.kv.snapshot()
        base.kv.restore(before)
        with chunk_budget(budget), torch.no_grad():
            eager = attention_core(module, q, k, v, SCALE, meta)
        assert torch.equal(replayed, eager), f"layout {seed}"
        assert all(torch.equal(a, b) for a, b in zip(after_replay, base.kv.tensors()))
        assert not torch.isnan(eager[0, :t]).any()
        assert torch.equal(eager[0, t:], torch.zeros_like(eager[0, t:]))


def test_emulated_capture_replays_new_metadata_bitwise_equal_to_eager():
    assert_graph_replays_new_metadata_bitwise(EmulatedBackend(torch.device("cpu")), budget=2000)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=-1000, max_value=1000), min_size=1, max_size=40))
def test_scan_free_prefix_equals_torch_scans(values):
    from parity.models.attention_tiles import prefix

    x = torch.tensor(values, dtype=torch.int64)
    assert torch.equal(prefix(x, "sum"), x.cumsum(0))
    assert torch.equal(prefix(x, "max"), torch.cummax(x, 0).values)
