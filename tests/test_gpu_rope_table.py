"""RoPE's table on CUDA: one Triton kernel against transformers' rotary embedding, bit for bit.

The kernel computes what the module computes (the position times each
frequency in float32, cos and sin, the attention scaling, the cast), each
step rounded as torch rounds it, with the CUDA math library's cos and sin
that torch's kernels call.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.models import fused_ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope", [None, LLAMA3_ROPE], ids=["default", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_kernel_is_transformers_table_bit_for_bit(dtype, rope, head_dim):
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=131072,
                         **({"rope_parameters": rope} if rope else {}))
    rotary = LlamaRotaryEmbedding(config).to("cuda", dtype)
    far = torch.randint(0, 131072, (400,), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(600), far]).cuda()
    x = torch.zeros(1, positions.numel(), 8, dtype=dtype, device="cuda")
    cos, sin = fused_ops.rope_table(positions, rotary.inv_freq, float(rotary.attention_scaling), dtype)
    want_cos, want_sin = rotary(x, position_ids=positions.unsqueeze(0))
    assert torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])
    # A token's row is the same alone as in a batch.
    alone = fused_ops.rope_table(positions[7:8], rotary.inv_freq, float(rotary.attention_scaling), dtype)
    assert torch.equal(alone[0], cos[7:8]) and torch.equal(alone[1], sin[7:8])
