"""The draft head's fused ops on CUDA, held bit for bit to the ops they replace.

- `fused_ops.embed` (the embedding gather of every forward): `nn.Embedding`'s
  rows, at a draft step's few ids and a verify's many;
- `fused_ops.rms_norm_pair` (EAGLE-3's two input norms and their concat):
  each half is what `fused_ops.rms_norm` gives the same rows;
- `fused_ops.row_linear_add` (a head layer's down projection and the residual
  add after it): what `row_linear` and torch's add give;
- `fused_ops.add_rms_norm` on a residual that is the pair's right half (a
  head whose residual is its normed hidden input): what it gives the same
  values held contiguously.

Each in one kernel, and a graph replay gives the eager bits.
"""

from __future__ import annotations

import pytest
import torch

from parity.models import fused_ops
from tests.cuda_kernels import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _randn(*shape, seed: int, scale: float = 1.0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens,vocab,h", [(1, 128256, 4096), (8, 128256, 4096), (37, 97, 1000), (0, 97, 64)])
def test_the_embedding_gather_is_the_embedding_rows(tokens, vocab, h, dtype):
    table = _randn(vocab, h, seed=30, dtype=dtype)
    ids = torch.randint(0, vocab, (tokens,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(31))
    got = fused_ops.embed(ids, table)
    assert got.shape == (tokens, h) and got.dtype == dtype
    assert torch.equal(got, torch.nn.functional.embedding(ids, table))
    if tokens:
        assert kernels(lambda: fused_ops.embed(ids, table)) == ["_embed_kernel"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,h", [(1, 4096), (8, 4096), (5, 1000)])
def test_the_norm_pair_is_the_two_norms_side_by_side(rows, h, dtype):
    a, b = _randn(rows, h, seed=1, dtype=dtype), _randn(rows, h, seed=2, scale=3.0, dtype=dtype)
    wa, wb = _randn(h, seed=3, dtype=dtype), _randn(h, seed=4, dtype=dtype)
    got = fused_ops.rms_norm_pair(a, wa, b, wb, 1e-5)
    want = torch.cat((fused_ops.rms_norm(a, wa, 1e-5), fused_ops.rms_norm(b, wb, 1e-5)), dim=-1)
    assert got.shape == (rows, 2 * h) and torch.equal(got, want)
    assert kernels(lambda: fused_ops.rms_norm_pair(a, wa, b, wb, 1e-5)) == ["_rms_norm_pair_kernel"]


def test_a_residual_held_in_the_pairs_right_half_adds_as_a_contiguous_one():
    a, b, wa, wb = _randn(8, 4096, seed=12), _randn(8, 4096, seed=13), _randn(4096, seed=14), _randn(4096, seed=15)
    x, w = _randn(8, 4096, seed=16), _randn(4096, seed=17)
    half = fused_ops.rms_norm_pair(a, wa, b, wb, 1e-5)[:, 4096:]
    got = fused_ops.add_rms_norm(x, half, w, 1e-5)
    want = fused_ops.add_rms_norm(x, half.contiguous(), w, 1e-5)
    assert all(torch.equal(g, e) for g, e in zip(got, want))
    assert kernels(lambda: fused_ops.add_rms_norm(x, half, w, 1e-5)) == ["_rms_norm_kernel"]


@pytest.mark.parametrize("n,k", [(4096, 14336), (1000, 300)])
def test_the_down_projection_adds_the_residual_as_torch_adds(n, k):
    for rows in (1, 8, 17):
        x, w = _randn(rows, k, seed=rows), _randn(n, k, seed=rows + 1, scale=0.02)
        residual = _randn(rows, n, seed=rows + 2)
        want = residual + fused_ops.row_linear(x, w, None)
        assert torch.equal(fused_ops.row_linear_add(x, w, residual), want)
        # a strided residual (a view of a wider tensor) too
        wide = _randn(rows, 2 * n, seed=rows + 3)
        assert torch.equal(fused_ops.row_linear_add(x, w, wide[:, n:]), wide[:, n:] + fused_ops.row_linear(x, w, None))
    assert kernels(lambda: fused_ops.row_linear_add(x, w, residual)) == ["_gemv_kernel"]


def test_a_graph_replay_gives_the_eager_bits():
    a, b, wa, wb = _randn(8, 4096, seed=5), _randn(8, 4096, seed=6), _randn(4096, seed=7), _randn(4096, seed=8)
    x, w, residual = _randn(8, 1000, seed=9), _randn(4096, 1000, seed=10, scale=0.02), _randn(8, 4096, seed=11)

    table, ids = _randn(1000, 4096, seed=18), torch.arange(8, device="cuda")

    def body():
        return (fused_ops.rms_norm_pair(a, wa, b, wb, 1e-6), fused_ops.row_linear_add(x, w, residual),
                fused_ops.embed(ids, table))

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = body()
    for seed, t in enumerate((a, b, x, residual), start=20):     # new inputs in the captured buffers
        t.copy_(_randn(*t.shape, seed=seed))
    ids.copy_(torch.tensor([999, 3, 3, 0, 500, 7, 1, 2], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    eager = body()
    assert all(torch.equal(o, e) for o, e in zip(outs, eager))
