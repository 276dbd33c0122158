"""A Llama decoder layer over the paged cache, in the fused ops of `fused_ops`.

The same weights and the same math as transformers' `LlamaDecoderLayer`
(on the CPU bit for bit), in the order inference engines run it: q/k/v
and gate/up are one GEMM each (`fused_weights`), RoPE rotates q and k in
one op, and the residual add of one layer is fused with the norm of the
next (`add_rms_norm`), so a layer hands on (its output, the residual) and
the caller adds them when it needs the hidden state itself (a draft head's
down projection adds its residual itself, `layer_output`). On CUDA a
layer is then about 13 kernels (its four weight GEMMs among them) where
transformers' modules launch about 60. The draft heads run their layers
here too (`decoder_layer`, `rms_norm`), each with its own input arrangement.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      eager_attention_forward)

from parity.models import fused_ops
from parity.models.fused_weights import GATE_UP, QKV, fused, row_kernels


# Within `observed_layers()`: the outputs of every decoder layer the fused path runs, in order (None: nobody watches).
_OBSERVED: ContextVar[list | None] = ContextVar("observed_layers", default=None)


@contextlib.contextmanager
def observed_layers():
    """Within: each decoder layer run through this module appends its outputs (a tuple of float copies: the layer's
    output, or its MLP output and residual, whose sum it is) to the list yielded. The layers run as functions of
    the layer module, not as calls of it, so a forward hook on the module never fires."""
    found: list = []
    token = _OBSERVED.set(found)
    try:
        yield found
    finally:
        _OBSERVED.reset(token)


def _observe(*tensors: torch.Tensor) -> None:
    found = _OBSERVED.get()
    if found is not None:
        found.append(tuple(t.detach().float().clone() for t in tensors))


def rope_tables(rotary_emb: nn.Module, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) [T, D] at `positions` [T], in x's dtype (x [T, h]): one op (`fused_ops.rope_table`) for
    transformers' Llama RoPE whose frequencies never change (every type but the dynamic ones), any other as its
    module."""
    rope_type = getattr(rotary_emb, "rope_type", "")
    if type(rotary_emb) is LlamaRotaryEmbedding and "dynamic" not in rope_type and rope_type != "longrope":
        return fused_ops.rope_table(positions, rotary_emb.inv_freq, float(rotary_emb.attention_scaling), x.dtype)
    cos, sin = rotary_emb(x.unsqueeze(0), position_ids=positions.unsqueeze(0))
    return cos[0], sin[0]


def linear(layer: nn.Module, x: torch.Tensor, rows: bool = True) -> torch.Tensor:
    """layer(x) for x [T, K]; `rows` (a draft head's projection) and an nn.Linear: `fused_ops.row_linear`, on CUDA
    one matrix-vector kernel for up to 32 rows. Any other module (a tensor-parallel linear, a fault's stand-in)
    runs as itself."""
    if rows and type(layer) is nn.Linear:
        return fused_ops.row_linear(x, layer.weight, layer.bias)
    return layer(x)


def float_logits(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """layer(x).float() for x [T, K], a draft head's logits: `fused_ops.row_logits` for an nn.Linear (on CUDA the
    matrix-vector kernel stores float32 itself), any other module as itself, then cast."""
    if type(layer) is nn.Linear:
        return fused_ops.row_logits(x, layer.weight, layer.bias)
    return layer(x).float()


def project(owner: nn.Module, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    """x through `owner`'s fused projection `names` (q/k/v, gate/up): one GEMM.

    A draft head's in `fused_ops.row_linear`. The target's stay with cuBLAS: its kernels overlap their launch with
    the kernel before (programmatic dependent launch) and the Triton kernel does not, which across a verify
    replay's 129 GEMMs cost more than the kernel time it saved (8B, batch 1 on an H100: 6.44-6.50 ms against
    6.34-6.38)."""
    weight, bias = fused(owner, names)
    return (fused_ops.row_linear if row_kernels(owner) else F.linear)(x, weight, bias)


def embed(table: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """table(ids): one op for an `nn.Embedding` that only looks rows up (no max_norm, which renormalises the table
    in place); any other module as itself."""
    if type(table) is nn.Embedding and table.max_norm is None:
        return fused_ops.embed(ids, table.weight)
    return table(ids)


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """norm(x) for x [T, h]: one op for transformers' RMSNorm; any other norm (zero-centred, Identity) as its module."""
    if type(norm) is LlamaRMSNorm:
        return fused_ops.rms_norm(x, norm.weight, norm.variance_epsilon)
    return norm(x)


def rms_norm_pair(norm_a: nn.Module, a: torch.Tensor, norm_b: nn.Module, b: torch.Tensor) -> torch.Tensor:
    """cat(norm_a(a), norm_b(b)) for a and b [T, h]: one op for two of transformers' RMSNorms of one epsilon."""
    if type(norm_a) is LlamaRMSNorm and type(norm_b) is LlamaRMSNorm and norm_a.variance_epsilon == \
            norm_b.variance_epsilon:
        return fused_ops.rms_norm_pair(a, norm_a.weight, b, norm_b.weight, norm_a.variance_epsilon)
    return torch.cat((rms_norm(norm_a, a), rms_norm(norm_b, b)), dim=-1)


def decoder_layer(layer: LlamaDecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  meta) -> torch.Tensor:
    """One whole layer on its input x [T, h] (the input norm the layer has, even nn.Identity): its output [T, h]."""
    return layer_output(layer, rms_norm(layer.input_layernorm, x), x, cos, sin, meta)


def layer_output(layer: LlamaDecoderLayer, normed: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, meta) -> torch.Tensor:
    """`layer_body`'s two results summed: the layer's output [T, h] (a draft head's down projection adds the
    residual itself: `_mlp`)."""
    normed, residual = _attention_block(layer, normed, residual, cos, sin, meta)
    out = _mlp(layer.mlp, normed, residual)
    _observe(out)
    return out


def norm_input(layer: LlamaDecoderLayer, hidden: torch.Tensor,
               residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_layernorm(x), x) where x = residual + hidden, the layer's input [T, h]."""
    norm = layer.input_layernorm
    if residual is None:
        return fused_ops.rms_norm(hidden, norm.weight, norm.variance_epsilon), hidden
    return fused_ops.add_rms_norm(hidden, residual, norm.weight, norm.variance_epsilon)


def layer_body(layer: LlamaDecoderLayer, normed: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, meta) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and MLP of one layer on its normed input: (mlp output, residual); their sum is the layer's output."""
    normed, residual = _attention_block(layer, normed, residual, cos, sin, meta)
    out = _mlp(layer.mlp, normed)
    _observe(out, residual)
    return out, residual


def _attention_block(layer: LlamaDecoderLayer, normed: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, meta) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's attention (or recurrent mixer) and the residual add with the post-attention norm: (the MLP's
    normed input, the residual)."""
    mixer = layer.self_attn
    # A hybrid target's recurrent layers (`recurrent.RecurrentMixer`) mix over their state slots instead.
    attn_out = mixer.mix(normed, meta) if hasattr(mixer, "mix") else _attention(mixer, normed, cos, sin, meta)
    post = layer.post_attention_layernorm
    return fused_ops.add_rms_norm(attn_out, residual, post.weight, post.variance_epsilon)


def _attention(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta) -> torch.Tensor:
    tokens, head_dim = x.shape[0], attn.head_dim
    heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
    qkv = project(attn, QKV, x).view(tokens, heads + 2 * kv_heads, head_dim)
    # RoPE on q and k at once; v stays a view of the projection's output.
    qk = fused_ops.rope(qkv[:, :heads + kv_heads], cos, sin)
    q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]
    # The attention the config names (`paged_attention` once the model is paged; without
    # metadata, e.g. sdpa over one causal sequence), in transformers' interface: it takes
    # [1, heads, T, D] (views here, no copies).
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager_attention_forward)
    extra = {"paged": meta} if meta is not None else {}
    out, _ = interface(attn, q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                       v.transpose(0, 1).unsqueeze(0), None, dropout=0.0, scaling=attn.scaling, **extra)
    return linear(attn.o_proj, out.reshape(tokens, -1), row_kernels(attn))


def _mlp(mlp, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The MLP's output on x [T, h]; with `residual`, residual + that output (a draft head's down projection adds it
    before its store: `fused_ops.row_linear_add`, on CUDA no add kernel of its own)."""
    gate_up = project(mlp, GATE_UP, x)
    if mlp.config.hidden_act == "silu":
        act = fused_ops.silu_and_mul(gate_up)
    else:
        gate, up = gate_up.chunk(2, dim=-1)
        act = mlp.act_fn(gate) * up
    down, rows = mlp.down_proj, row_kernels(mlp)
    if residual is None:
        return linear(down, act, rows)
    if rows and type(down) is nn.Linear and down.bias is None:
        return fused_ops.row_linear_add(act, down.weight, residual)
    return residual + linear(down, act, rows)
