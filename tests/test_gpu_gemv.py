"""A draft head's projections on CUDA (`fused_ops.row_linear`): one Triton kernel up to 32 rows, cuBLAS beyond.

The kernel's sum runs in another order than cuBLAS's, so its values are held
to the fp32 product within what cuBLAS's own bf16 result is held to; what
graph parity needs is exact: a row's bits are the same alone, in any batch
of up to 16 (or of 17 to 32) rows and in a CUDA graph's replay.
"""

from __future__ import annotations

import pytest
import torch

from parity.models import fused_ops
from tests.cuda_kernels import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = ((1000, 300), (4097, 1000), (6144, 8192), (4096, 14336))


def _pair(rows: int, n: int, k: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    return x, w


@pytest.mark.parametrize("n,k", SHAPES)
def test_the_kernel_is_cublas_within_bf16_rounding(n, k):
    for rows in (1, 3, 8, 16, 17, 32):
        x, w = _pair(rows, n, k, rows)
        exact = torch.nn.functional.linear(x.float(), w.float())
        # one bf16 step of the largest output: the rounding of the result, summed in either order
        tolerance = dict(rtol=2 ** -7, atol=2 ** -7 * float(exact.abs().max()))
        torch.testing.assert_close(torch.nn.functional.linear(x, w).float(), exact, **tolerance)
        torch.testing.assert_close(fused_ops.row_linear(x, w, None).float(), exact, **tolerance)


@pytest.mark.parametrize("n,k", SHAPES)
def test_logits_are_the_products_bits_as_float32_in_one_kernel(n, k):
    for rows in (1, 8, 17, 33):
        x, w = _pair(rows, n, k, rows)
        want = fused_ops.row_linear(x, w, None).float()
        got = fused_ops.row_logits(x, w, None)
        assert got.dtype == torch.float32 and torch.equal(got, want)
    x, w = _pair(8, 32000, 4096, 1)
    assert kernels(lambda: fused_ops.row_logits(x, w, None)) == ["_gemv_kernel"]


def test_up_to_32_rows_run_the_kernel_and_more_run_cublas():
    x, w = _pair(33, 4096, 4096, 0)
    assert kernels(lambda: fused_ops.row_linear(x[:32], w, None)) == ["_gemv_kernel"]
    assert "_gemv_kernel" not in kernels(lambda: fused_ops.row_linear(x, w, None))
    bias = torch.zeros(4096, dtype=torch.bfloat16, device="cuda")
    assert "_gemv_kernel" not in kernels(lambda: fused_ops.row_linear(x[:1], w, bias))


@pytest.mark.parametrize("n,k", SHAPES[:3])
def test_a_rows_bits_do_not_depend_on_the_batch(n, k):
    from parity.models import triton_gemv

    x, w = _pair(32, n, k, 7)
    alone = [triton_gemv.gemv(x[i:i + 1].clone(), w) for i in range(16)]
    for rows in (2, 5, 16):
        batch = triton_gemv.gemv(x[:rows], w)
        assert all(torch.equal(batch[i], alone[i][0]) for i in range(rows))
    full = triton_gemv.gemv(x, w)       # 17 to 32 rows: the rows padded to 32
    for rows in (17, 24):
        assert torch.equal(triton_gemv.gemv(x[:rows], w), full[:rows])


def test_a_graph_replay_gives_the_eager_bits():
    x, w = _pair(8, 4097, 1000, 3)
    static = x.clone()
    fused_ops.row_linear(static, w, None)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_ops.row_linear(static, w, None)
    for seed in (4, 5):
        fresh, _ = _pair(8, 4097, 1000, seed)
        static.copy_(fresh)
        graph.replay()
        assert torch.equal(out, fused_ops.row_linear(fresh, w, None))
