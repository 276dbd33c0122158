"""The two per-forward tables of the decoder on CUDA, each one Triton kernel, against what they replace.

`attention_tiles.tile_layout` (where the tokens sit in the attention tiles)
against its torch implementation on good batches and on the broken metadata
a fault hands in, bit for bit and dtype for dtype; `fused_ops.rope_table`
against transformers' rotary module at every position of an 8k context, bit
for bit, for the rope types the engine's models use.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.models import attention_tiles
from parity.models.attention_tiles import plan_tiles
from parity.models.decoder_layer import rope_tables

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@st.composite
def batches(draw):
    num_tokens, num_rows = draw(st.integers(1, 300)), draw(st.integers(1, 70))
    if draw(st.booleans()):         # good metadata: 0 = qsl[0] <= ... <= T
        cuts = sorted(draw(st.lists(st.integers(0, num_tokens), min_size=num_rows, max_size=num_rows)))
        qsl = [0] + cuts
    else:                           # stale or broken: anything near the batch's range
        qsl = draw(st.lists(st.integers(-2, 3 * num_tokens), min_size=num_rows + 1, max_size=num_rows + 1))
    dtypes = st.sampled_from([torch.int32, torch.int64])
    return num_tokens, qsl, draw(dtypes), draw(dtypes), draw(st.integers(1, 80))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(batches())
def test_the_tile_layout_kernel_is_the_torch_layout_bit_for_bit(batch):
    num_tokens, qsl, qsl_dtype, table_dtype, table_width = batch
    rows = len(qsl) - 1
    plan = plan_tiles(num_tokens, rows, 32, 8, 128, 2, 16, 16 * table_width, table_width)
    q = torch.tensor(qsl, dtype=qsl_dtype, device="cuda")
    table = torch.randint(0, 10_000, (rows, table_width), dtype=table_dtype, device="cuda")
    args = (num_tokens, plan.tile_len, plan.num_tiles, plan.num_blocks)
    torch_path = attention_tiles._torch_tile_layout(q, table, *args)
    kernel = attention_tiles.tile_layout(q, table, *args)       # the op's CUDA implementation: the kernel
    for name, want, got in zip(("slot tokens", "target", "tile rows", "blocks"), torch_path, kernel):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got, want), (name, qsl, plan.tile_len)


@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}],
                         ids=["default", "llama3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_rope_table_kernel_is_transformers_rotary_module_bit_for_bit(rope, dtype):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    parameters = {"rope_type": "default", "rope_theta": 500000.0, **(rope or {})}
    config = LlamaConfig(hidden_size=4096, num_attention_heads=32, max_position_embeddings=131072,
                         rope_parameters=parameters)
    module = LlamaRotaryEmbedding(config).to("cuda")
    positions = torch.cat((torch.arange(8192, device="cuda"), torch.tensor([131071, 65537, 0], device="cuda")))
    x = torch.zeros(positions.shape[0], 4096, dtype=dtype, device="cuda")
    want = module(x.unsqueeze(0), position_ids=positions.unsqueeze(0))
    module.forward = lambda *args, **kwargs: pytest.fail("rope_tables called the module, not the kernel")
    got = rope_tables(module, x, positions)
    assert got[0].dtype == want[0].dtype == dtype
    assert torch.equal(got[0], want[0][0]) and torch.equal(got[1], want[1][0])
