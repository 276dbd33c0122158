"""Triton kernels for the per-token ops of a decoder layer: the embedding gather, RMSNorm (with the residual add,
or two side by side), RoPE, SiLU-and-mul.

Each is one kernel where transformers' modules launch four to eight, and each
rounds where the module rounds: the residual sum, the normalised value before
the weight, each RoPE product, the SiLU before the product are stored in the
model's dtype in between, as the modules' separate ops store them. For that
the kernels are compiled without floating-point contraction
(`enable_fp_fusion=False`): with it, the compiler turned RoPE's
`(x1 * c1).to(bf16) + (-x2 * s1).to(bf16)` into one bf16 multiply and one
bf16 FMA, so the second product was never rounded (one bf16 step off in
0.1% of elements on an H100, read in the PTX: `fma.rn.bf16`). RoPE is then
transformers' arithmetic; the norm's mean (summed in another order) and
SiLU's exp (Triton's) are not bit for bit transformers', which nothing
needs: every mode and every reference of a run use the same kernels.

Only the CUDA implementations of `parity.models.fused_ops` call these; the
module imports triton, so import it only where triton is importable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, res_stride, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0)
    if HAS_RES:
        # residual + hidden, stored in the model dtype: the next layer's residual.
        x = (x.to(tl.float32) + tl.load(res_ptr + row * res_stride + cols, mask=inside, other=0.0).to(tl.float32))
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, x, mask=inside)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=inside)


def rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [T, h] (contiguous; plus `residual`, any row stride), normalised and scaled by `weight`; and the sum when
    there is a residual."""
    rows, cols = x.shape
    out = torch.empty_like(x)
    total = torch.empty_like(x) if residual is not None else None
    if rows:
        _rms_norm_kernel[(rows,)](x, residual if residual is not None else x, weight, out,
                                  total if total is not None else out, cols,
                                  residual.stride(0) if residual is not None else cols, eps,
                                  HAS_RES=residual is not None,
                                  BLOCK=triton.next_power_of_2(cols), enable_fp_fusion=False)
    return out, total


@triton.jit
def _rms_norm_pair_kernel(a_ptr, b_ptr, wa_ptr, wb_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # Program (row, side): side 0 normalises a's row into the left half of out's row, side 1 b's into the right,
    # with `_rms_norm_kernel`'s arithmetic.
    row = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    if side == 0:
        x = tl.load(a_ptr + row * n_cols + cols, mask=inside, other=0.0)
        w = tl.load(wa_ptr + cols, mask=inside, other=0.0)
    else:
        x = tl.load(b_ptr + row * n_cols + cols, mask=inside, other=0.0)
        w = tl.load(wb_ptr + cols, mask=inside, other=0.0)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * 2 * n_cols + side * n_cols + cols,
             (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=inside)


def rms_norm_pair(a: torch.Tensor, weight_a: torch.Tensor, b: torch.Tensor, weight_b: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """[RMSNorm(a) | RMSNorm(b)] for a and b [T, h] (contiguous, one dtype): [T, 2h], each half as `rms_norm`
    computes it."""
    rows, cols = a.shape
    out = torch.empty((rows, 2 * cols), dtype=a.dtype, device=a.device)
    if rows:
        _rms_norm_pair_kernel[(rows, 2)](a, b, weight_a, weight_b, out, cols, eps,
                                         BLOCK=triton.next_power_of_2(cols), enable_fp_fusion=False)
    return out


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, stride_t, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    # One program per token: every head of it, both halves of the head dim.
    token = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HALF)[None, :]
    inside = h < heads
    base = x_ptr + token * stride_t + h * 2 * HALF + d
    x1 = tl.load(base, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=inside, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + token * 2 * HALF + d).to(tl.float32)
    c2 = tl.load(cos_ptr + token * 2 * HALF + HALF + d).to(tl.float32)
    s1 = tl.load(sin_ptr + token * 2 * HALF + d).to(tl.float32)
    s2 = tl.load(sin_ptr + token * 2 * HALF + HALF + d).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1): each product rounded, then the sum.
    lo = (x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)
    hi = (x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)
    out = out_ptr + token * heads * 2 * HALF + h * 2 * HALF + d
    tl.store(out, lo.to(dtype), mask=inside)
    tl.store(out + HALF, hi.to(dtype), mask=inside)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] (heads contiguous, any token stride) rotated by cos/sin [T, D]: a contiguous result."""
    tokens, heads, head_dim = x.shape
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    if tokens:
        _rope_kernel[(tokens,)](x, cos, sin, out, heads, x.stride(0), HALF=head_dim // 2,
                                BLOCK_H=triton.next_power_of_2(heads), enable_fp_fusion=False)
    return out


@triton.jit
def _rope_table_kernel(pos_ptr, inv_ptr, cos_ptr, sin_ptr, scaling, HALF: tl.constexpr):
    # One program per token: its angle at every frequency, then cos and sin written to both halves of its rows.
    token = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    freqs = tl.load(pos_ptr + token).to(tl.float32) * tl.load(inv_ptr + d).to(tl.float32)
    dtype = cos_ptr.dtype.element_ty
    cos = (tl.cos(freqs) * scaling).to(dtype)
    sin = (tl.sin(freqs) * scaling).to(dtype)
    row = token * 2 * HALF + d
    tl.store(cos_ptr + row, cos)
    tl.store(cos_ptr + row + HALF, cos)
    tl.store(sin_ptr + row, sin)
    tl.store(sin_ptr + row + HALF, sin)


def rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, 2 * len(inv_freq)] in `dtype` at `positions` [T] (both contiguous)."""
    tokens, half = positions.shape[0], inv_freq.shape[0]
    cos = torch.empty((tokens, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if tokens:
        _rope_table_kernel[(tokens,)](positions, inv_freq, cos, sin, float(scaling), HALF=half,
                                      enable_fp_fusion=False)
    return cos, sin


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, width, BLOCK: tl.constexpr):
    # Program (row, block of columns): x's row holds [gate | up], each `width` wide.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < width
    g = tl.load(x_ptr + row * 2 * width + cols, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * width + width + cols, mask=inside, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (act * u).to(dtype), mask=inside)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x [T, 2I] = [gate | up] (contiguous): [T, I]."""
    tokens, width = x.shape[0], x.shape[1] // 2
    out = torch.empty((tokens, width), dtype=x.dtype, device=x.device)
    if tokens:
        block = 1024
        _silu_and_mul_kernel[(tokens, triton.cdiv(width, block))](x, out, width, BLOCK=block, enable_fp_fusion=False)
    return out


@triton.jit
def _embed_kernel(ids_ptr, w_ptr, out_ptr, vocab, width, BLOCK: tl.constexpr):
    # Program (token, block of columns): the token's row of the table, copied.
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(ids_ptr + token).to(tl.int64)
    inside = (cols < width) & (row >= 0) & (row < vocab)
    tl.store(out_ptr + token * width + cols, tl.load(w_ptr + row * width + cols, mask=inside, other=0.0),
             mask=cols < width)


def embed(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight[ids] for ids [T] and a contiguous table [V, h]: [T, h], the rows copied (an id outside the table,
    which `nn.Embedding` refuses, gives a row of zeros)."""
    tokens, (vocab, width) = ids.shape[0], weight.shape
    out = torch.empty((tokens, width), dtype=weight.dtype, device=weight.device)
    if tokens:
        block = min(4096, triton.next_power_of_2(width))
        _embed_kernel[(tokens, triton.cdiv(width, block))](ids, weight, out, vocab, width, BLOCK=block)
    return out
