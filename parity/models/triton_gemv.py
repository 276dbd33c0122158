"""x @ W.T for a few rows of x, in one Triton kernel that streams W once at close to the HBM's bandwidth.

A draft step multiplies one to eight rows by each weight: the GEMM is a
matrix-vector product bound by reading W. On an H100 whose device-to-device
copy runs at 3.0 TB/s, cuBLAS's kernels for that shape read the synthetic
8B EAGLE-3 head's weights at 2.7-2.9 TB/s, and in a draft step three of the
five split over K with a reduce kernel after each; this kernel reads them at
2.8-3.0 TB/s in one kernel each. Each program owns BLOCK_N output columns
and walks all of K in BLOCK_K chunks, multiplying the rows (padded to 16 or
32 for the tensor cores) by the chunk of W with fp32 accumulation, then
rounds once to the output dtype.

No split over K and no atomics: the sum's order is fixed by BLOCK_K alone,
and the block sizes are a fixed function of the shape (`config`), never
timed at run time, so every process, every mode and every graph computes the
same bits for a row whatever else is in a batch of up to 16 rows (or of 17
to 32).

Only the CUDA implementations of `fused_ops.row_linear`,
`fused_ops.row_linear_add` (the residual added before the store: a head
layer's last add without a kernel of its own) and `fused_ops.row_logits` (the
same product stored as float32, a head's logits without the cast kernel
after) call it; the module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 32


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, res_ptr, rows, n, k, x_stride, w_stride, out_stride, res_stride,
                 HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * x_stride + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * w_stride + offs_k[None, :]
    m_in, n_in = offs_m[:, None] < rows, offs_n[:, None] < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        k_in = (start + offs_k)[None, :] < k
        x = tl.load(x_ptrs, mask=m_in & k_in, other=0.0)
        w = tl.load(w_ptrs, mask=n_in & k_in, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = out_ptr + offs_m[:, None] * out_stride + offs_n[None, :]
    inside = m_in & (offs_n[None, :] < n)
    # Rounded to x's dtype first: an fp32 output holds exactly the 16-bit result, upcast.
    out = acc.to(x_ptr.dtype.element_ty)
    if HAS_RES:
        # residual + product, each in x's dtype, summed in fp32 and rounded once: torch's add of the two.
        res = tl.load(res_ptr + offs_m[:, None] * res_stride + offs_n[None, :], mask=inside, other=0.0)
        out = (res.to(tl.float32) + out.to(tl.float32)).to(x_ptr.dtype.element_ty)
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=inside)


def config(k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for a weight of `k` columns: a fixed function of the shape.

    32 x 512 (4 warps, 3 stages) was the fastest or within 2% of it for the 8B heads' weights at one and eight
    rows on an H100, among 36 configurations (BLOCK_N 16-64, BLOCK_K 128-512, 4 or 8 warps, 3 or 5 stages):
    2.8-3.0 TB/s against a 3.0 TB/s device-to-device copy."""
    return 32, min(512, max(16, triton.next_power_of_2(k))), 4, 3


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes this product: up to MAX_ROWS rows (a draft step's and an 8-request draft
    prefill's), 16-bit floats, unit stride along K."""
    return (x.dim() == 2 and weight.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1 and weight.stride(1) == 1
            and x.shape[1] == weight.shape[1])


def gemv(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T -> [M, N] in x's dtype (M <= MAX_ROWS; the rows padded to 16 or 32); with
    `out_dtype` (float32) the same values stored in it, as `.to(out_dtype)` of the product would give them; with
    `residual` ([M, N] in x's dtype, unit stride along N) `residual + product`, as torch adds the two."""
    rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty((rows, n), dtype=out_dtype or x.dtype, device=x.device)
    block_m = 16 if rows <= 16 else 32
    block_n, block_k, warps, stages = config(k)
    res = out if residual is None else residual
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, out, res, rows, n, k, x.stride(0), weight.stride(0),
                                             out.stride(0), res.stride(0), HAS_RES=residual is not None,
                                             BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
                                             num_stages=stages)
    return out

