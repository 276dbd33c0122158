"""The target's fused decoder layers compute transformers' Llama, bit for bit on the CPU.

`TargetModel` runs its layers through `decoder_layer` (q/k/v and gate/up
as one GEMM each, RoPE and SiLU-and-mul as one op, the residual add fused
with the next norm); the engine's every mode depends on that being the
model the checkpoint describes. Here the same weights go through
transformers' own `LlamaModel.forward` (sdpa, one causal sequence) and
through the fused layers (the same sdpa): the hidden states must be equal
bit for bit. And fused weights can never go stale.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from parity.models.fused_weights import fused
from parity.models.llama import build_target
from parity.builders.training.train import attention_implementation


def _config(**extra) -> LlamaConfig:
    return LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                       **extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "mlp_bias": True}], ids=["plain", "biases"])
def test_fused_layers_equal_transformers_bit_for_bit(dtype, extra):
    torch.manual_seed(0)
    target = build_target(_config(**extra), aux_layers=(0, 2, 3)).to(dtype)
    if extra:
        for name, p in target.named_parameters():
            if name.endswith(".bias"):
                p.data.normal_()
    ids = torch.randint(0, 97, (11,))
    with torch.no_grad(), attention_implementation("sdpa", target.config):
        hidden, aux = target(ids, torch.arange(11), None)
        states = target.hf.model(input_ids=ids.unsqueeze(0), output_hidden_states=True)
    h = target.config.hidden_size
    assert torch.equal(hidden, states.last_hidden_state[0])
    # Aux features: the inputs of layers 0 and 2, and (id N) the last layer's output before the norm.
    assert torch.equal(aux[:, :h], states.hidden_states[0][0])
    assert torch.equal(aux[:, h:2 * h], states.hidden_states[2][0])
    assert torch.equal(target.hf.model.norm(aux[:, 2 * h:]), hidden)


def test_projections_are_views_of_the_fused_weight_and_a_move_fuses_again():
    target = build_target(_config())
    attn = target.decoder_layers()[1].self_attn
    weight, _ = fused(attn, ("q_proj", "k_proj", "v_proj"))
    assert attn.k_proj.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    with torch.no_grad():
        attn.k_proj.weight[0, 0] = 7.0      # writes through to the fused weight
    assert weight[attn.q_proj.weight.shape[0], 0] == 7.0
    target.to(torch.float32)                # a move that moves nothing keeps the fused weight, uncopied
    assert fused(attn, ("q_proj", "k_proj", "v_proj"))[0] is weight
    target.to(torch.float64)
    weight, _ = fused(attn, ("q_proj", "k_proj", "v_proj"))
    assert weight.dtype == torch.float64 and weight[attn.q_proj.weight.shape[0], 0] == 7.0
    assert attn.v_proj.weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()


def test_a_reassigned_projection_is_refused_not_silently_stale():
    target = build_target(_config())
    mlp = target.decoder_layers()[0].mlp
    mlp.up_proj.weight = torch.nn.Parameter(torch.zeros_like(mlp.up_proj.weight))
    with pytest.raises(RuntimeError, match="changed after they were fused"):
        fused(mlp, ("gate_proj", "up_proj"))


def test_draft_heads_project_in_the_row_op_and_the_target_in_cublas():
    """Which projections `fused_ops.row_linear` / `row_logits` take (on CUDA the few-row kernel): every GEMM of a
    draft head's forward and logits, none of the target's (its verify replay was slower with them)."""
    from parity.models.pair import load_pair
    from tests.dispatch_log import Seen

    pair = load_pair("tiny-llama3-eagle3")
    ids, positions = torch.tensor([3, 5, 7]), torch.arange(3)
    with (torch.no_grad(), attention_implementation("sdpa", pair.target.config),
          attention_implementation("sdpa", pair.head.config)):
        with Seen() as target_ops:
            hidden, aux = pair.target(ids, positions, None)
            pair.target.logits(hidden)
        with Seen() as head_ops:
            draft = pair.head(ids, positions, pair.head.fuse_target_hidden(aux), None)
            pair.head.own_logits(draft)
    assert "parity.row_linear.default" not in target_ops.ops and "aten.mm.default" in target_ops.ops
    # q/k/v, o and gate/up, down with the residual add, then the lm_head with its cast to float32 as one op; the fc
    # fusion runs eagerly outside the drafter's graphs
    assert head_ops.ops.count("parity.row_linear.default") == 3 and "aten.mm.default" in head_ops.ops
    assert head_ops.ops.count("parity.row_linear_add.default") == 1 and "aten.add.Tensor" not in head_ops.ops
    assert head_ops.ops.count("parity.rms_norm_pair.default") == 1 and "aten.cat.default" not in head_ops.ops
    assert head_ops.ops.count("parity.row_logits.default") == 1 and "aten._to_copy.default" not in head_ops.ops


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rope", [None, LLAMA3_ROPE], ids=["default", "llama3"])
def test_rope_tables_are_one_op_and_transformers_table_bit_for_bit(dtype, rope):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from parity.models.decoder_layer import rope_tables
    from tests.dispatch_log import Seen

    config = LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=131072,
                         **({"rope_parameters": rope} if rope else {}))
    rotary = LlamaRotaryEmbedding(config).to(dtype)
    positions = torch.tensor([0, 1, 5, 100, 8191, 70000, 131000])
    x = torch.zeros(7, 512, dtype=dtype)
    with torch.no_grad(), Seen() as ops:
        cos, sin = rope_tables(rotary, x, positions)
    assert ops.ops == ["parity.rope_table.default"]
    want_cos, want_sin = rotary(x.unsqueeze(0), position_ids=positions.unsqueeze(0))
    assert cos.dtype == dtype and torch.equal(cos, want_cos[0]) and torch.equal(sin, want_sin[0])


def test_a_dynamic_rope_stays_its_module():
    """Dynamic RoPE recomputes its frequencies from the positions it is given: the module's own forward runs."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from parity.models.decoder_layer import rope_tables
    from tests.dispatch_log import Seen

    config = LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=64,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(100)
    with torch.no_grad(), Seen() as ops:
        cos, _ = rope_tables(rotary, torch.zeros(100, 512), positions)
    assert "parity.rope_table.default" not in ops.ops
    assert torch.equal(cos, rotary(torch.zeros(1, 100, 512), position_ids=positions.unsqueeze(0))[0][0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_linear_add_fallback_allocates_its_output_alone(dtype):
    """Where the matrix-vector kernel does not take a shape (the tiny pairs' float32 on CUDA), `row_linear_add`
    runs its torch implementation inside the op: one product, then the residual added into it in place, so a
    graph pool gets the op's output and no temporary, as on the emulated backend (which sees the op alone).
    The in-place sum is torch's `residual + product` bit for bit."""
    from parity.models import fused_ops
    from tests.dispatch_log import Seen

    torch.manual_seed(0)
    x, w, residual = (torch.randn(5, 48).to(dtype), torch.randn(40, 48).to(dtype), torch.randn(5, 40).to(dtype))
    with torch.no_grad(), Seen() as ops:
        got = fused_ops._linear_add(x, w, residual)
    fresh = [op for op in ops.ops if not op.split(".")[1].endswith("_") and not op.startswith(("aten.t.", "aten.view"))]
    assert len(fresh) == 1 and ops.ops[-1] == "aten.add_.Tensor", ops.ops
    assert torch.equal(got, residual + torch.nn.functional.linear(x, w))
