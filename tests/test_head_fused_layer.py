"""The draft heads' fused layers compute transformers' modules, bit for bit on the CPU, in fewer ops.

Every head's `forward` (what the engine runs) drives its decoder layer through
`decoder_layer`'s fused ops, as the target does: q/k/v and gate/up one GEMM
each, RoPE and SiLU-and-mul one op, the residual add fused with the norm.
Each head keeps its own input arrangement (EAGLE-1: no input layernorm;
EAGLE-3: q/k/v over the 2h concat of the normed embeddings and hidden, and
the residual taken before or after hidden_norm; MTP: per-layer norms and
projection, Qwen3-Next's zero-centred norms). Here each head's forward is
checked against the same weights run through the modules' own forwards
(transformers' path, the one training runs): equal bit for bit, in fp32 and
bf16, at a few shapes; and the fused forward dispatches fewer ops (on the
GPU: launches fewer kernels).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from parity.builders.saver import save_eagle1
from parity.builders.training.train import attention_implementation
from parity.models.eagle1 import Eagle1Head
from parity.models.eagle3 import Eagle3Head
from parity.models.fused_weights import GATE_UP, QKV, fused
from parity.models.llama import build_target
from parity.models.loader import load_eagle1
from parity.models.mtp import DEEPSEEK, LAYOUTS, QWEN3NEXT, MtpHead
from tests.test_paged_attention import OpCounter

VOCAB = 97
SHAPES = {   # name -> config overrides; (hidden, heads, kv heads, head_dim) and the extras each head must honour
    "gqa": dict(hidden_size=64, intermediate_size=160, num_attention_heads=8, num_key_value_heads=2, head_dim=8),
    "mha-bias": dict(hidden_size=48, intermediate_size=96, num_attention_heads=3, num_key_value_heads=3,
                     head_dim=16, attention_bias=True, mlp_bias=True),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _config(shape: str, layers: int = 1, **extra) -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, num_hidden_layers=layers, max_position_embeddings=128, rope_theta=500000.0,
                       **SHAPES[shape], **extra)


def _randomise(head: torch.nn.Module) -> None:
    """Norm gains and biases off their init (ones, zeros), so a swapped or skipped one changes the output."""
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, LlamaRMSNorm):
                module.weight.normal_(1.0, 0.3)
        for name, p in head.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)


def _head(kind: str, shape: str, dtype: torch.dtype, seed: int = 0, device: str = "cpu"):
    torch.manual_seed(seed)
    config = _config(shape, layers=3 if kind.startswith("mtp") else 1,
                     **({"norm_before_residual": True} if kind == "eagle3-nbr" else {}))
    embed = torch.nn.Embedding(VOCAB, config.hidden_size)
    lm_head = torch.nn.Linear(config.hidden_size, VOCAB, bias=False)
    if kind == "eagle1":
        head = Eagle1Head(config).share(embed, lm_head)
    elif kind.startswith("eagle3"):
        head = Eagle3Head(config).share(embed)
    else:
        head = MtpHead(config, kind).share(embed, lm_head)
    _randomise(head)
    head = head.to(device, dtype).eval().requires_grad_(False)
    if kind.startswith("mtp"):
        step = torch.tensor([1], device=device)     # the middle one of its three layers
        head = head.with_step_index(lambda: step)
    return head


def _reference(head, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The head's forward through its modules' own forwards (transformers' layer), [T, h]."""
    embeds = head.embed_tokens(ids).unsqueeze(0)
    hidden, position_ids = hidden.to(embeds.dtype).unsqueeze(0), positions.unsqueeze(0)
    if isinstance(head, Eagle3Head):
        return head.layer_forward(embeds, hidden, position_ids)[0]
    if isinstance(head, Eagle1Head):
        x = head.fc(torch.cat((embeds, hidden), dim=-1))
        rope = head.rotary_emb(x, position_ids=position_ids)
        return head.layers[0](x, attention_mask=None, position_ids=position_ids, position_embeddings=rope)[0]
    if head.layout == DEEPSEEK:
        embeds = torch.where((positions == 0).view(1, -1, 1), torch.zeros_like(embeds), embeds)
    rope = head.rotary_emb(embeds, position_ids=position_ids)
    outputs = []
    for i, block in enumerate(head.blocks):
        x = torch.cat((head._part(head.enorm, i)(embeds), head._part(head.hnorm, i)(hidden)), dim=-1)
        out = block(head._part(head.eh_proj, i)(x), attention_mask=None, position_ids=position_ids,
                    position_embeddings=rope)
        outputs.append(head._part(head.final_norm, i)(out) if head.layout == QWEN3NEXT else out)
    return head._select(outputs)[0]


def _inputs(head, tokens: int):
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, VOCAB, (tokens,), generator=gen)
    positions = torch.arange(tokens)
    return ids, positions, torch.randn(tokens, head.config.hidden_size, generator=gen)


HEADS = ["eagle1", "eagle3", "eagle3-nbr", *LAYOUTS]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", HEADS)
def test_fused_head_forward_equals_the_modules_bit_for_bit(kind, shape, dtype):
    head = _head(kind, shape, dtype)
    for tokens in (1, 6, 13):
        ids, positions, hidden = _inputs(head, tokens)
        with torch.no_grad(), attention_implementation("sdpa", head.config):
            got, want = head(ids, positions, hidden), _reference(head, ids, positions, hidden)
        assert got.dtype == want.dtype == dtype and got.shape == (tokens, head.config.hidden_size)
        assert torch.equal(got, want), f"{kind} {shape} T={tokens}: max diff {(got - want).abs().max()}"


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", DEEPSEEK])
def test_fused_head_forward_dispatches_fewer_ops(kind):
    head = _head(kind, "gqa", torch.float32)
    ids, positions, hidden = _inputs(head, 4)
    counts = {}
    with torch.no_grad(), attention_implementation("sdpa", head.config):
        for name, call in (("fused", head), ("modules", lambda *a: _reference(head, *a))):
            with OpCounter() as count:
                call(ids, positions, hidden)
            counts[name] = count.ops
    assert counts["fused"] < counts["modules"] * 0.7, counts


def test_a_loaded_head_runs_fused_weights_viewed_by_its_published_ones(tmp_path):
    torch.manual_seed(0)
    target = build_target(_config("gqa", layers=2))
    head = _head("eagle1", "gqa", torch.float32).share(target.embed_tokens, target.lm_head)
    save_eagle1(head, tmp_path / "head")
    loaded = load_eagle1(tmp_path / "head", target, dtype=torch.bfloat16)
    layer = loaded.decoder_layers()[0]
    for owner, names in ((layer.self_attn, QKV), (layer.mlp, GATE_UP)):
        weight, _ = fused(owner, names)
        assert weight.dtype == torch.bfloat16
        assert all(getattr(owner, n).weight.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
                   for n in names)
    assert torch.equal(layer.self_attn.k_proj.weight, head.layers[0].self_attn.k_proj.weight.bfloat16())


def test_training_through_the_fused_forward_is_refused_the_modules_still_train():
    head = _head("eagle3", "gqa", torch.float32).requires_grad_(True).train()
    ids, positions, hidden = _inputs(head, 5)
    with attention_implementation("sdpa", head.config), pytest.raises(RuntimeError, match="no gradient"):
        head(ids, positions, hidden)
    with attention_implementation("sdpa", head.config):
        _reference(head, ids, positions, hidden).sum().backward()
    assert head.midlayer.self_attn.k_proj.weight.grad is not None and head.midlayer.mlp.up_proj.weight.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["eagle1", "eagle3", DEEPSEEK])
def test_gpu_fused_head_forward_launches_fewer_kernels(kind):
    from parity.harness.bench_scale import gpu_kernels

    head = _head(kind, "gqa", torch.bfloat16, device="cuda")
    ids, positions, hidden = (t.cuda() for t in _inputs(head, 8))
    calls = {"fused": lambda: head(ids, positions, hidden), "modules": lambda: _reference(head, ids, positions, hidden)}
    with torch.no_grad(), attention_implementation("sdpa", head.config):
        for call in calls.values():
            call()                      # warm-up: Triton compiles, cuBLAS picks its kernels
        kernels = {name: gpu_kernels(call, "cuda")[0] for name, call in calls.items()}
    assert kernels["fused"] < kernels["modules"] * 0.7, kernels
