"""The CUDA kernels of the decoder layer against plain references, on the GPU.

Paged attention on CUDA is the Triton kernel of `parity.models.triton_attention`:
the same cases as the CPU tests (random block tables, GQA, sliding windows,
padded tokens and rows, long contexts), against the same float64 causal
reference, plus the property a graph needs: a FULL graph of it replays new
metadata bitwise equal to running it eagerly. The per-token ops
(`parity.models.fused_ops`) against transformers' own modules on the GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from parity.graphs.cuda import CudaBackend
from parity.models import fused_ops
from parity.models.paged_attention import attention_core
from tests.test_paged_attention import (MIXED, SCALE, assert_graph_replays_new_metadata_bitwise, check,
                                        make_case)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_triton_attention_matches_reference(head_dim, groups, window, dtype):
    # fp32: a score sums head_dim products, so its rounding error grows with head_dim (CPU tests use 8).
    tolerance = dict(rtol=1e-5, atol=1e-6 * head_dim / 8) if dtype == torch.float32 else None
    check(make_case(MIXED, groups=groups, head_dim=head_dim, window=window, dtype=dtype, pad_tokens=3, pad_rows=2,
                    seed=groups + head_dim, device="cuda"), tolerance=tolerance)


def test_triton_attention_long_context_and_big_blocks():
    """Contexts of 300 and 1000 positions in blocks of 16: many BLOCK_N steps, rows stopping at different keys."""
    check(make_case([(1000, 4), (300, 4), (0, 9), (57, 1)], block_size=16, max_model_len=1040, groups=4,
                    head_dim=32, pad_tokens=5, pad_rows=1, seed=7, device="cuda"))


def test_triton_attention_is_deterministic():
    case = make_case(MIXED, groups=4, head_dim=64, dtype=torch.bfloat16, window=6, seed=3, device="cuda")
    module = SimpleNamespace(layer_idx=0)
    with torch.no_grad():
        first = attention_core(module, case.query, case.key, case.value, SCALE, case.meta).clone()
        again = attention_core(module, case.query, case.key, case.value, SCALE, case.meta)
    assert torch.equal(first, again)


def test_cuda_graph_of_triton_attention_replays_new_metadata_bitwise():
    assert_graph_replays_new_metadata_bitwise(CudaBackend(torch.device("cuda")), device="cuda", head_dim=32)


# --- the per-token ops against transformers' modules ---------------------------------------

def test_rope_is_transformers_bit_for_bit_and_silu_and_mul_within_a_step_in_bf16():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator(device="cuda").manual_seed(0)
    # q and k side by side in one projection output, as the fused q/k/v GEMM writes them.
    qkv = torch.randn(37, 32 + 2 * 8, 128, device="cuda", generator=gen).bfloat16()
    angles = torch.rand(37, 64, device="cuda", generator=gen) * 100
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).bfloat16()
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).bfloat16()
    got = fused_ops.rope(qkv[:, :40], cos, sin)
    # transformers' layout: [1, heads, T, D] with cos/sin [1, T, D].
    q4, k4 = apply_rotary_pos_emb(qkv[:, :32].transpose(0, 1).unsqueeze(0), qkv[:, 32:40].transpose(0, 1).unsqueeze(0),
                                  cos.unsqueeze(0), sin.unsqueeze(0))
    # RoPE rounds each product and the sum where transformers' ops round them (no FMA
    # contraction, see triton_pointwise): the same bits.
    assert torch.equal(got[:, :32], q4[0].transpose(0, 1))
    assert torch.equal(got[:, 32:], k4[0].transpose(0, 1))
    # SiLU's exp is Triton's: one rounding step of bf16 apart at most.
    bf16_step = dict(rtol=2 ** -7, atol=2 ** -9)
    gate_up = torch.randn(37, 2 * 14336, device="cuda", generator=gen).bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(fused_ops.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up, **bf16_step)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_matches_transformers(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator(device="cuda").manual_seed(1)
    norm = LlamaRMSNorm(4096, eps=1e-5).to("cuda", dtype)
    norm.weight.data = (torch.rand(4096, device="cuda", generator=gen) + 0.5).to(dtype)
    x = torch.randn(19, 4096, device="cuda", generator=gen).to(dtype)
    residual = torch.randn(19, 4096, device="cuda", generator=gen).to(dtype)
    # One rounding step of the output dtype apart at most (the mean is summed in another order).
    tol = dict(rtol=2 ** -7, atol=2 ** -9) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_ops.rms_norm(x, norm.weight, 1e-5), norm(x), **tol)
    normed, total = fused_ops.add_rms_norm(x, residual, norm.weight, 1e-5)
    assert torch.equal(total, residual + x)
    torch.testing.assert_close(normed, norm(residual + x), **tol)


def test_triton_attention_reads_bounds_and_blocks_by_their_strides(device="cuda"):
    """A broadcast causal bound (every slot of a tile bounded by its row's end) and a block table sliced from a
    wider one give what their contiguous copies give, bit for bit: the kernel reads them where torch does (it
    read a broadcast bound past its storage, so a forward was not reproducible)."""
    from parity.models import triton_attention

    gen = torch.Generator().manual_seed(3)
    tiles, tile_len, kv_heads, groups, head_dim, block_size, num_blocks = 3, 4, 2, 2, 16, 4, 5
    cache = torch.randn(32 * block_size, kv_heads, head_dim, generator=gen).to(device)
    values = torch.randn(32 * block_size, kv_heads, head_dim, generator=gen).to(device)
    query = torch.randn(tiles * tile_len, kv_heads * groups, head_dim, generator=gen).to(device)
    slots = torch.arange(tiles * tile_len, device=device)
    wide = torch.randperm(32, generator=gen)[:tiles * 2 * num_blocks].view(tiles, 2 * num_blocks).to(device)
    blocks = wide[:, ::2]                                           # strides (2 * num_blocks, 2)
    ends = torch.tensor([[6], [13], [19]], device=device)
    hi = ends.expand(tiles, tile_len)                               # strides (1, 0)
    args = (query, cache, values, slots, slots)
    strided = triton_attention.paged_attend(*args, blocks, hi, None, 0.25, tile_len, block_size)
    dense = triton_attention.paged_attend(*args, blocks.contiguous(), hi.contiguous(), None, 0.25, tile_len,
                                          block_size)
    assert torch.equal(strided, dense)
