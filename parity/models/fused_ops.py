"""The per-token ops of a decoder layer as torch custom ops: one op, one kernel on CUDA.

Each op's default implementation is transformers' own math, op for op (so on
the CPU a layer computes exactly what `LlamaDecoderLayer` computes); where
triton is importable the CUDA implementation is one Triton kernel
(`triton_pointwise`). Being custom ops, they reach a TorchDispatchMode as one
call with their inputs and fresh outputs, on both backends alike: the
emulated graph records and replays the op, the CUDA read tracer sees what the
kernel reads, and both graph pools place the same outputs (the default
implementation's temporaries, which no CUDA kernel would allocate, stay below
the dispatch mode).
"""

from __future__ import annotations

import importlib.util

import torch

from parity.models.direct_op import DirectOp

# Whether the CUDA implementations are Triton kernels (this module's and `paged_attention`'s).
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' LlamaRMSNorm.forward
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def _embed(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The embedding rows of ids [T]: [T, h] (`nn.Embedding`'s forward)."""
    return torch.nn.functional.embedding(ids, weight)


# On CUDA one gather kernel with a program per token: `index_select`'s kernel for 16 ids or fewer (a draft step's)
# walks the ids in every thread, 7.7 us for eight rows of an 8B table on an H100.
embed = DirectOp("parity::embed", _embed)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [T, h]."""
    return _torch_rms_norm(x, weight, eps)


rms_norm = DirectOp("parity::rms_norm", _rms_norm)


def _rms_norm_pair(a: torch.Tensor, weight_a: torch.Tensor, b: torch.Tensor, weight_b: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """[RMSNorm(a) | RMSNorm(b)] for a and b [T, h]: [T, 2h] (EAGLE-3's two input norms and their concat)."""
    return torch.cat((_torch_rms_norm(a, weight_a, eps), _torch_rms_norm(b, weight_b, eps)), dim=-1)


rms_norm_pair = DirectOp("parity::rms_norm_pair", _rms_norm_pair)


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + x), residual + x): a layer's residual add and the norm after it."""
    return _torch_add_rms_norm(x, residual, weight, eps)


add_rms_norm = DirectOp("parity::add_rms_norm", _add_rms_norm)


def _torch_add_rms_norm(x, residual, weight, eps):
    total = residual + x
    return _torch_rms_norm(total, weight, eps), total


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # transformers' apply_rotary_pos_emb, for one of q and k
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (_rotate_half(x) * sin)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] rotated by cos/sin [T, D]; q and k go in as one [T, H + KVH, D]."""
    return _torch_rope(x, cos, sin)


rope = DirectOp("parity::rope", _rope)


def _torch_rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # transformers' LlamaRotaryEmbedding.forward (no dynamic update) for one sequence of positions
    freqs = positions[:, None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _rope_table(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) [T, D] in `dtype` at `positions` [T] (int64), from the frequencies `inv_freq` [D / 2] and
    the attention scaling: eight kernels in torch (the product, the concatenation, cos, sin, two scalings, two
    casts), one on CUDA."""
    return _torch_rope_table(positions, inv_freq, scaling, dtype)


rope_table = DirectOp("parity::rope_table", _rope_table)


def _torch_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # LlamaMLP's act_fn(gate) * up, gate and up side by side in x [T, 2I]
    width = x.shape[-1] // 2
    return torch.nn.functional.silu(x[:, :width]) * x[:, width:]


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x [T, 2I] = [gate | up] (the fused gate_up projection's output)."""
    return _torch_silu_and_mul(x)


silu_and_mul = DirectOp("parity::silu_and_mul", _silu_and_mul)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] @ weight [N, K].T (+ bias): nn.Linear's forward."""
    return torch.nn.functional.linear(x, weight, bias)


# A draft head's projections: on CUDA up to 32 rows go through `triton_gemv`, which reads the weight at close to the
# HBM's bandwidth where cuBLAS's kernels for so few rows do not; more rows stay with cuBLAS. The target keeps cuBLAS
# (`decoder_layer.project`).
row_linear = DirectOp("parity::row_linear", _linear)


def _linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ weight.T: a layer's last projection and the residual add after it.

    The sum is taken in the product's own tensor (IEEE addition commutes: torch's `residual + product`, bit for
    bit): the op allocates its output and nothing else, as the CUDA kernel does, so a graph pool places the same
    blocks on CUDA when a shape falls back here (the tiny pairs' float32) as the emulated pool, which sees the op's
    output alone."""
    product = _linear(x, weight, None)
    if product.dtype != residual.dtype or product.shape != residual.shape:
        return residual + product
    return product.add_(residual)


# A draft head layer's down projection with its residual: on CUDA the matrix-vector kernel adds it before the store.
row_linear_add = DirectOp("parity::row_linear_add", _linear_add)


def _logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`_linear(...).float()`: a draft head's lm_head and its cast to float32 as one op."""
    return _linear(x, weight, bias).float()


# On CUDA the matrix-vector kernel stores the rounded product as float32 itself: one kernel fewer per draft forward.
row_logits = DirectOp("parity::row_logits", _logits)


if HAS_TRITON:
    @row_linear.register_kernel("cuda")
    def _(x, weight, bias):
        from parity.models import triton_gemv
        if bias is not None or not triton_gemv.fits(x, weight):
            return _linear(x, weight, bias)
        return triton_gemv.gemv(x, weight)

    @row_linear_add.register_kernel("cuda")
    def _(x, weight, residual):
        from parity.models import triton_gemv
        if not (triton_gemv.fits(x, weight) and residual.dtype == x.dtype and residual.dim() == 2
                and residual.shape == (x.shape[0], weight.shape[0]) and residual.stride(1) == 1):
            return _linear_add(x, weight, residual)
        return triton_gemv.gemv(x, weight, residual=residual)

    @row_logits.register_kernel("cuda")
    def _(x, weight, bias):
        from parity.models import triton_gemv
        if bias is not None or not triton_gemv.fits(x, weight):
            return _logits(x, weight, bias)
        return triton_gemv.gemv(x, weight, torch.float32)

    @embed.register_kernel("cuda")
    def _(ids, weight):
        # a strided id vector stays with torch's gather: a contiguous copy here would be a block of the graph pool
        # that the emulated pool never sees
        if not (ids.dim() == 1 and ids.stride(0) == 1 and weight.dim() == 2 and weight.is_contiguous()
                and not ids.is_floating_point()):
            return _embed(ids, weight)
        from parity.models import triton_pointwise
        return triton_pointwise.embed(ids, weight)

    @rms_norm.register_kernel("cuda")
    def _(x, weight, eps):
        if not x.is_contiguous():
            return _torch_rms_norm(x, weight, eps)
        from parity.models import triton_pointwise
        return triton_pointwise.rms_norm(x, None, weight, eps)[0]

    @rms_norm_pair.register_kernel("cuda")
    def _(a, weight_a, b, weight_b, eps):
        if not (a.is_contiguous() and b.is_contiguous() and a.shape == b.shape and a.dtype == b.dtype
                and weight_a.dtype == weight_b.dtype):
            return _rms_norm_pair(a, weight_a, b, weight_b, eps)
        from parity.models import triton_pointwise
        return triton_pointwise.rms_norm_pair(a, weight_a, b, weight_b, eps)

    @add_rms_norm.register_kernel("cuda")
    def _(x, residual, weight, eps):
        # the residual may be a view of wider rows (EAGLE-3's normed hidden input, half of its norm pair's output)
        if not (x.is_contiguous() and residual.dim() == 2 and residual.shape == x.shape and residual.stride(1) == 1):
            return _torch_add_rms_norm(x, residual, weight, eps)
        from parity.models import triton_pointwise
        return triton_pointwise.rms_norm(x, residual, weight, eps)

    @rope.register_kernel("cuda")
    def _(x, cos, sin):
        head_dim = x.shape[-1]
        if not (_is_pow2(head_dim // 2) and head_dim % 2 == 0 and x.stride(2) == 1 and x.stride(1) == head_dim
                and cos.is_contiguous() and sin.is_contiguous()):
            return _torch_rope(x, cos, sin)
        from parity.models import triton_pointwise
        return triton_pointwise.rope(x, cos, sin)

    @rope_table.register_kernel("cuda")
    def _(positions, inv_freq, scaling, dtype):
        if not (_is_pow2(inv_freq.shape[0]) and positions.is_contiguous() and inv_freq.is_contiguous()):
            return _torch_rope_table(positions, inv_freq, scaling, dtype)
        from parity.models import triton_pointwise
        return triton_pointwise.rope_table(positions, inv_freq, scaling, dtype)

    @silu_and_mul.register_kernel("cuda")
    def _(x):
        if not x.is_contiguous():
            return _torch_silu_and_mul(x)
        from parity.models import triton_pointwise
        return triton_pointwise.silu_and_mul(x)
