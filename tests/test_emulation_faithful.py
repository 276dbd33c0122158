"""The graph backends reproduce CUDA-graph semantics, bugs included.

Tiny hand-written functions (not the engine) read a registered persistent
buffer through a metadata object or directly; each test captures one on a
backend and checks that replay behaves as a CUDA graph does: it keeps reading
the captured address after a rebind, keeps stale values when a refresh is
skipped, keeps Python values baked at capture, follows in-place copies
exactly, and lets a later capture into the same pool overwrite a released
output. The same test bodies run on the emulated backend (CPU) and, marked
`gpu`, on the cuda backend, so the two cannot drift apart.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.engine.buffers import InputBuffers, register_attention_buffers
from parity.engine.kv_cache import PagedKVCache
from parity.engine.metadata import MetadataBuilder, RowPlan
from parity.errors import CaptureSyncError
from parity.graphs.capture import capture
from parity.graphs.manifest import audit, build_manifest
from parity.models.paged_attention import paged_attention

BACKENDS = ["emulated", pytest.param("cuda", marks=pytest.mark.gpu)]
READERS = ["metadata", "direct"]
N = 1024   # 4 KiB of fp32: one CUDA allocator block, so pool reuse is predictable


def make_backend(name: str):
    if name == "cuda":
        from parity.graphs.cuda import CudaBackend
        return CudaBackend(torch.device("cuda"))
    from parity.graphs.emulated import EmulatedBackend
    return EmulatedBackend(torch.device("cpu"))


def _bound(fn, meta):
    return fn if meta is None else (lambda: fn(meta))


def graph_capture(backend, fn, meta=None, pool=None, piecewise=False, weak_outputs=True):
    """Warm up and capture `fn(meta)` (or `fn()`), as the graph executor does."""
    pool = pool if pool is not None else backend.new_pool("test")
    backend.warmup(_bound(fn, meta))
    return capture(backend, pool, _bound(fn, meta), piecewise=piecewise, weak_outputs=weak_outputs)


def replay(graph, meta=None) -> torch.Tensor:
    return graph.replay(meta)[0].detach().cpu().clone()


def eager(fn, meta=None) -> torch.Tensor:
    return _bound(fn, meta)()[0].detach().cpu().clone()


class Owner:
    """One registered buffer `x`, read through the metadata object or straight from the registry."""

    def __init__(self, backend, reader: str):
        self.device = backend.device
        self.registry = InputBuffers("toy", self.device)
        self.registry.register("x", (N,), torch.float32).copy_(self.values(1))
        self.reader = reader

    def values(self, seed: int) -> torch.Tensor:
        return torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(self.device)

    def meta(self):
        return SimpleNamespace(x=self.registry["x"])

    def fn(self, meta):
        x = meta.x if self.reader == "metadata" else self.registry["x"]
        return (torch.tanh(x * 3.0 + 1.0).cumsum(0),)

    def expected(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 3.0 + 1.0).cumsum(0).cpu()


# --- (a) a buffer rebound to a new tensor ------------------------------------------------

@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_rebound_buffer_replay_reads_the_captured_tensor(backend_name, reader):
    backend = make_backend(backend_name)
    owner = Owner(backend, reader)
    old = owner.registry["x"]
    graph = graph_capture(backend, owner.fn, owner.meta())
    manifest = build_manifest(graph.read_storages, [owner.registry])
    assert [e.name for e in manifest] == ["x"]
    assert audit(manifest, [owner.registry]) == []

    owner.registry.rebind("x", owner.values(2))      # the bug: a new address, not a copy
    live = owner.meta()
    now = eager(owner.fn, live)
    replayed = replay(graph, live)
    assert torch.equal(now, owner.expected(owner.values(2)))
    assert torch.equal(replayed, owner.expected(old)), "replay must keep reading the captured tensor"
    assert not torch.equal(replayed, now)
    findings = audit(manifest, [owner.registry])
    assert [(f.name, f.captured_address, f.live_address) for f in findings] == \
        [("x", old.data_ptr(), owner.registry["x"].data_ptr())]


# --- (b) a refresh skipped ----------------------------------------------------------------

@pytest.mark.parametrize("backend_name", BACKENDS)
def test_skipped_refresh_replays_stale_values(backend_name):
    backend = make_backend(backend_name)
    owner = Owner(backend, "metadata")
    graph = graph_capture(backend, owner.fn, owner.meta())
    manifest = build_manifest(graph.read_storages, [owner.registry])

    # The step's values reach the metadata object (eager reads them) but not the buffer.
    stale_meta = SimpleNamespace(x=owner.values(3))
    now = eager(owner.fn, stale_meta)
    replayed = replay(graph, stale_meta)
    assert torch.equal(now, owner.expected(owner.values(3)))
    assert torch.equal(replayed, owner.expected(owner.values(1))), "replay must read the unrefreshed buffer"
    assert audit(manifest, [owner.registry]) == [], "same address: an audit cannot see a stale value"

    owner.registry["x"].copy_(owner.values(3))         # the refresh
    assert torch.equal(replay(graph, owner.meta()), now)


# --- (c) a Python value baked at capture ----------------------------------------------

@pytest.mark.parametrize("backend_name", BACKENDS)
def test_python_step_index_is_frozen_at_capture(backend_name):
    backend = make_backend(backend_name)
    device = backend.device
    registry = InputBuffers("toy", device)
    table = registry.register("table", (4, N), torch.float32)
    table.copy_(torch.randn(4, N, generator=torch.Generator().manual_seed(0)).to(device))
    step_index = registry.register("draft_step", (1,), torch.int64)
    state = {"step": 0}

    def python_index():
        return (table[state["step"]] * 2.0,)

    def tensor_index():
        return (table.index_select(0, step_index)[0] * 2.0,)

    frozen = graph_capture(backend, python_index)
    follows = graph_capture(backend, tensor_index)
    state["step"] = 2
    step_index.fill_(2)
    assert torch.equal(eager(python_index), (table[2] * 2.0).cpu())
    assert torch.equal(replay(frozen), (table[0] * 2.0).cpu()), "the Python int must stay at its capture value"
    assert torch.equal(replay(follows), eager(python_index)), "a tensor index is read at replay"


# --- (d) copies into the captured buffer --------------------------------------------------

@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_in_place_copy_replays_bitwise_equal_to_eager(backend_name, reader):
    backend = make_backend(backend_name)
    owner = Owner(backend, reader)
    graph = graph_capture(backend, owner.fn, owner.meta())
    for seed in (4, 5, 6):
        owner.registry["x"].copy_(owner.values(seed))
        meta = owner.meta()
        assert torch.equal(replay(graph, meta), eager(owner.fn, meta)), f"values {seed}"


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_replay_of_matmul_softmax_is_bitwise_eager(backend_name):
    """A denser body (matmul, softmax, reductions, views) still replays exactly."""
    backend = make_backend(backend_name)
    device = backend.device
    registry = InputBuffers("toy", device)
    a = registry.register("a", (16, 32), torch.float32)
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)).to(device)

    def fn():
        h = (a @ w).reshape(4, 4, 8).transpose(0, 1)
        p = torch.softmax(h.float(), dim=-1)
        return (p.sum(dim=1) + h.amax(dim=1),)

    a.copy_(torch.randn(16, 32, generator=torch.Generator().manual_seed(2)).to(device))
    graph = graph_capture(backend, fn)
    a.copy_(torch.randn(16, 32, generator=torch.Generator().manual_seed(3)).to(device))
    assert torch.equal(replay(graph), eager(fn))


# --- (e) host syncs during capture ----------------------------------------------------

def _item(x):
    return (x * float(x[0].item()),)


def _mask(x):
    return (x[x > 0] * 2,)


def _nonzero(x):
    return (torch.nonzero(x > 0).float(),)


def _branch(x):
    return (x * 2 if x.sum() > 0 else x,)


@pytest.mark.parametrize("body", [_item, _mask, _nonzero, _branch], ids=["item", "bool-mask", "nonzero", "branch"])
def test_host_sync_during_capture_raises(body):
    backend = make_backend("emulated")
    x = torch.randn(8)
    with pytest.raises(CaptureSyncError):
        capture(backend, backend.new_pool("p"), lambda: body(x), piecewise=False)
    # The failed capture left no recorder behind: host reads work and a new capture is clean.
    assert isinstance(x[0].item(), float)
    graph = capture(backend, backend.new_pool("p"), lambda: (x * 2,), piecewise=False)
    x.copy_(torch.randn(8))
    assert torch.equal(graph.replay()[0], x * 2)


# --- (f) pool aliasing -----------------------------------------------------------------

@pytest.mark.parametrize("pools, weak_outputs, aliased", [("shared", True, True), ("separate", True, False),
                                                         ("shared", False, False)])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_released_output_is_overwritten_by_a_later_graph_in_the_same_pool(backend_name, pools, weak_outputs,
                                                                          aliased):
    backend = make_backend(backend_name)
    device = backend.device
    x = torch.randn(N, generator=torch.Generator().manual_seed(7)).to(device)
    y = torch.randn(N, generator=torch.Generator().manual_seed(8)).to(device)
    pool_a = backend.new_pool("a")
    pool_b = pool_a if pools == "shared" else backend.new_pool("b")

    graph_a = graph_capture(backend, lambda: (x * 2.0,), pool=pool_a, weak_outputs=weak_outputs)
    # B's first temporary has exactly the size of A's released output.
    graph_b = graph_capture(backend, lambda: ((y * 3.0) + 1.0,), pool=pool_b, weak_outputs=weak_outputs)
    out_a = graph_a.replay()[0]
    graph_b.replay()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if aliased:
        assert not torch.equal(out_a.cpu(), (x * 2.0).cpu()), "A's released output must be overwritten"
        assert torch.equal(out_a.cpu(), (y * 3.0).cpu()), "by B's temporary"
    else:
        assert torch.equal(out_a.cpu(), (x * 2.0).cpu())


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_fresh_block_goes_to_the_smallest_free_block_that_fits(backend_name):
    """Best fit, as the caching allocator does, not the first free block in address order.

    A's capture leaves two holes, 16 KiB then 8 KiB, each fenced by a live
    output. B's 8 KiB output must fill the second hole (right after A's first
    fence), where first fit would put it at the start of the first.
    """
    backend = make_backend(backend_name)
    x = torch.randn(4 * N, generator=torch.Generator().manual_seed(11)).to(backend.device)
    pool = backend.new_pool("shared")

    def a():
        big = x * 2.0                    # 16 KiB, dies at the end of the capture
        fence_1 = x[:128] + 1.0          # 512 B, an output
        small = x[: 2 * N] * 3.0         # 8 KiB, dies
        fence_2 = x[:128] + 2.0          # 512 B, an output
        del big, small
        return fence_1, fence_2

    graph_a = graph_capture(backend, a, pool=pool, weak_outputs=False)
    graph_b = graph_capture(backend, lambda: (x[: 2 * N] * 5.0,), pool=pool, weak_outputs=False)
    fence_1, fence_2 = graph_a.outputs
    placed = graph_b.outputs[0]
    assert placed.data_ptr() == fence_1.data_ptr() + 512
    assert placed.data_ptr() + 2 * N * 4 == fence_2.data_ptr()


# --- (g) piecewise: attention runs eagerly on live metadata ---------------------------

def _attention_setup(device):
    block_size, max_model_len, heads, kv_heads, head_dim, tokens = 4, 16, 2, 1, 4, 6
    buffers = InputBuffers("toy", device)
    register_attention_buffers(buffers, 8, 2, max_model_len // block_size)
    kv = PagedKVCache(1, 8, block_size, kv_heads, head_dim, torch.float32, device)
    builder = MetadataBuilder(buffers, kv, block_size, max_model_len)
    gen = torch.Generator().manual_seed(9)
    q = buffers.register("q", (1, heads, tokens, head_dim), torch.float32)
    k = buffers.register("k", (1, kv_heads, tokens, head_dim), torch.float32)
    v = buffers.register("v", (1, kv_heads, tokens, head_dim), torch.float32)
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, generator=gen).to(device))
    module = SimpleNamespace(layer_idx=0)

    def fn(meta):
        out, _ = paged_attention(module, q * 1.0, k * 1.0, v * 1.0, None, scaling=0.5, paged=meta)
        return (out * 2.0,)

    rows = [RowPlan(0, [1] * tokens, 0, [5, 2, 7, 0])]
    return builder, rows, fn, tokens


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("piecewise", [True, False], ids=["piecewise", "full"])
def test_reassigned_metadata_shows_in_full_but_not_in_piecewise(backend_name, piecewise):
    backend = make_backend(backend_name)
    builder, rows, fn, tokens = _attention_setup(backend.device)
    meta = builder.build(rows, tokens, 1)
    graph = graph_capture(backend, fn, meta, piecewise=piecewise)
    assert len(graph.segments) == (2 if piecewise else 1)
    assert torch.equal(replay(graph, meta), eager(fn, meta))

    # The bug: seq_lens rebound to a tensor that says the context is 3 tokens long.
    fresh = builder.buffers["seq_lens"].clone()
    fresh[0] = 3
    builder.buffers.rebind("seq_lens", fresh)
    live = builder.make_view(tokens, 1, 1, tokens, tokens, 3)
    now = eager(fn, live)
    assert not torch.equal(now, eager(fn, meta)), "the rebound seq_lens must change the eager output"
    if piecewise:
        assert torch.equal(replay(graph, live), now), "piecewise attention reads the live metadata"
    else:
        assert not torch.equal(replay(graph, live), now), "a FULL graph keeps the captured seq_lens"
