"""Tree attention (topk > 1) against a brute-force reference: each node over its context and its ancestors.

Requests of a tree forward: query token 0 is the root (the request's last token,
which sees its context), tokens 1.. are tree nodes laid out parents first. The
cache holds finite garbage (an unmasked key shows), the trash row NaN, padded
tokens' q/k/v NaN. The reference is softmax(q k^T * scale) v in float64 over
exactly the keys a node may see, built from the parents, not from the bits.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder, RowPlan
from parity.engine.tree_metadata import RowTree, ancestor_bits, register_tree_buffers
from parity.models import attention_tiles, paged_attention

SCALE = 0.37
BLOCK, MAX_LEN, KVH, GROUPS, D = 4, 48, 2, 2, 8


def depths(parents):
    out = []
    for p in parents:
        out.append(1 + (out[p] if p >= 0 else 0))
    return out


def tree_plan(req_id, first, parents, blocks):
    """The verify row of a request whose root sits at `first`, its nodes after it."""
    positions = (first,) + tuple(first + d for d in depths(parents))
    tree = RowTree(positions, first + 1, (0,) + tuple(ancestor_bits(parents)))
    return RowPlan(req_id, [0] * (1 + len(parents)), first, blocks, tree)


def visible(first, parents, i):
    """Sequence indices query token i of a tree row may see: the context, then itself and its ancestors."""
    keys = list(range(first + 1))
    node = i - 1
    chain = []
    while node >= 0:
        chain.append(first + 1 + node)
        node = parents[node]
    return keys + sorted(chain) if i > 0 else keys


def build(rows_spec, pad_tokens, pad_rows, seed=0):
    gen = torch.Generator().manual_seed(seed)
    heads = KVH * GROUPS
    lens = [first + 1 + len(parents or []) for first, parents in rows_spec]
    needed = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(needed) + 2
    order = torch.randperm(num_blocks, generator=gen).tolist()
    kv = PagedKVCache(1, num_blocks, BLOCK, KVH, D, torch.float32, "cpu")
    for cache in kv.tensors():
        cache.copy_(torch.randn(cache.shape, generator=gen) * 3)
        cache[-1] = float("nan")
    plans, keys, values, queries = [], [], [], []
    for i, (first, parents) in enumerate(rows_spec):
        blocks, order = order[: needed[i]], order[needed[i]:]
        k = torch.randn(lens[i], KVH, D, generator=gen)
        v = torch.randn(lens[i], KVH, D, generator=gen)
        for j in range(first):
            slot = blocks[j // BLOCK] * BLOCK + j % BLOCK
            kv.keys[0][slot], kv.values[0][slot] = k[j], v[j]
        plans.append(tree_plan(i, first, parents, blocks) if parents is not None else
                     RowPlan(i, [0], first, blocks))
        keys.append(k)
        values.append(v)
        queries.append(torch.randn(lens[i] - first, heads, D, generator=gen))
    n = sum(q.shape[0] for q in queries)
    nan = lambda h: torch.full((pad_tokens, h, D), float("nan"))   # noqa: E731
    q = torch.cat(queries + [nan(heads)])
    k = torch.cat([kk[f:] for kk, (f, _) in zip(keys, rows_spec)] + [nan(KVH)])
    v = torch.cat([vv[f:] for vv, (f, _) in zip(values, rows_spec)] + [nan(KVH)])
    buffers = InputBuffers("test", "cpu")
    register_attention_buffers(buffers, n + pad_tokens, len(rows_spec) + pad_rows, -(-MAX_LEN // BLOCK))
    register_tree_buffers(buffers, n + pad_tokens, MAX_LEN)
    meta = MetadataBuilder(buffers, kv, BLOCK, MAX_LEN).build(plans, n + pad_tokens, len(rows_spec) + pad_rows)
    return meta, (q, k, v), keys, values, queries, n


def reference(rows_spec, keys, values, queries, num_tokens_padded):
    out = torch.zeros(num_tokens_padded, KVH * GROUPS, D, dtype=torch.float64)
    t = 0
    for (first, parents), k, v, q in zip(rows_spec, keys, values, queries):
        for i in range(q.shape[0]):
            seen = visible(first, parents or [], i)
            for h in range(KVH * GROUPS):
                kk, vv = k[seen, h // GROUPS].double(), v[seen, h // GROUPS].double()
                out[t, h] = torch.softmax(kk @ q[i, h].double() * SCALE, dim=0) @ vv
            t += 1
    return out


CASES = {
    "one-tree": [(5, [-1, -1, 0, 0, 2, 1])],
    "two-trees-and-a-decode": [(3, [-1, 0, -1, 1, 2]), (9, None), (6, [-1, -1, -1, 0, 1, 2, 3])],
    "a-chain-as-a-tree": [(7, [-1, 0, 1, 2])],
}


@pytest.mark.parametrize("budget", [None, 0], ids=["one-chunk", "block-chunks"])
@pytest.mark.parametrize("name", list(CASES))
def test_tree_attention_matches_brute_force(name, budget, monkeypatch):
    rows_spec = CASES[name]
    if budget is not None:
        monkeypatch.setattr(attention_tiles, "CHUNK_BUDGET_BYTES", budget)
    meta, (q, k, v), keys, values, queries, n = build(rows_spec, pad_tokens=3, pad_rows=1)
    with torch.no_grad():
        out = paged_attention.attention_core(SimpleNamespace(layer_idx=0), q.transpose(0, 1).unsqueeze(0),
                                             k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                                             SCALE, meta)[0]
    expected = reference(rows_spec, keys, values, queries, n + 3)
    torch.testing.assert_close(out[:n].double(), expected[:n], rtol=1e-5, atol=1e-6)
    assert torch.equal(out[n:], torch.zeros_like(out[n:])), "padded tokens output exactly 0"


def test_tree_rotary_positions_are_depths_and_keys_their_own_slots():
    parents = [-1, -1, 0, 2]
    meta, *_ = build([(5, parents)], pad_tokens=2, pad_rows=0)
    assert meta.positions[:5].tolist() == [5, 6, 6, 7, 8]
    assert meta.tree_seq[:5].tolist() == [5, 6, 7, 8, 9]
    assert meta.tree_bits[:5].tolist() == [0, 0b1, 0b10, 0b101, 0b1101]
    assert meta.tree_bits[5:].tolist() == [0, 0], "padding sees no node"


def test_without_tree_buffers_the_metadata_has_no_tree():
    buffers = InputBuffers("test", "cpu")
    register_attention_buffers(buffers, 8, 2, 4)
    kv = PagedKVCache(1, 8, BLOCK, KVH, D, torch.float32, "cpu")
    meta = MetadataBuilder(buffers, kv, BLOCK, 16).build([RowPlan(0, [1, 2], 0, [0])], 4, 1)
    assert meta.tree_bits is None and "tree_bits" not in buffers
