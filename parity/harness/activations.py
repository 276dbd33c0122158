"""Bytes of the largest moment of each forward, from config numbers only (the memory plan's activations).

A forward's largest moment is either inside a decoder layer (the residual
stream, q/k/v and RoPE'd copies, the attention transient of
`attention_tiles.transient_bytes`, or SwiGLU's three [T, intermediate] tensors)
or at its end (the target's logits: lm_head's output in the weights' dtype and
its fp32 copy, [T, vocab] each; the drafter's per-row logits and sampling
temporaries). Layers run one after another, so one layer counts. These are
upper bounds in the caching allocator's terms (what is alive at once), not
what a profiler shows; `tests/test_memory_plan.py` pins them against the
engine where it can be exact and the GPU run compares them with measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.models.attention_tiles import plan_tiles, transient_bytes

FP32 = 4
# Sampling temporaries per drafted row and vocabulary entry, in fp32, at most: logits, log_softmax,
# the draft distribution, its softmax, top-2 (rejection.sample_draft / _emit; greedy holds fewer).
DRAFT_SAMPLING_COPIES = 5


@dataclass(frozen=True)
class Dims:
    """The numbers of a decoder stack the activations depend on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, c: dict, layers: int | None = None, vocab: int | None = None) -> "Dims":
        heads = c["num_attention_heads"]
        return cls(layers if layers is not None else c.get("num_hidden_layers", 1), c["hidden_size"], heads,
                   c.get("num_key_value_heads") or heads, c.get("head_dim") or c["hidden_size"] // heads,
                   c.get("intermediate_size") or 4 * c["hidden_size"], vocab or c["vocab_size"])


@dataclass(frozen=True)
class Geometry:
    """What shapes the attention's context walk: the KV block size, max_model_len, the block table's width."""

    block_size: int
    max_model_len: int
    blocks_per_seq: int


def attention_bytes(d: Dims, tokens: int, rows: int, itemsize: int, g: Geometry) -> int:
    """The transient of one paged-attention call at `tokens` tokens in `rows` request rows."""
    plan = plan_tiles(tokens, rows, d.heads, d.kv_heads, d.head_dim, itemsize, g.block_size, g.max_model_len,
                      g.blocks_per_seq)
    return transient_bytes(plan, d.heads, d.head_dim, itemsize, g.block_size)


def layer_bytes(d: Dims, tokens: int, rows: int, itemsize: int, g: Geometry, attention: bool) -> int:
    """One decoder layer's largest moment; `attention` False: attention runs elsewhere (a PIECEWISE pool)."""
    t, s, h = tokens, itemsize, d.hidden
    residual = 2 * t * h * s + 2 * t * h * FP32          # residual, normed hidden; RMSNorm's fp32 copies
    qkv = (d.heads + 2 * d.kv_heads) * d.head_dim
    attn = t * s * (qkv + (d.heads + d.kv_heads) * d.head_dim + h)     # projections, RoPE'd q/k, o_proj
    attn += attention_bytes(d, t, rows, s, g) if attention else (t + 1) * d.heads * d.head_dim * s
    mlp = t * s * (3 * d.intermediate + h)
    return residual + max(attn, mlp)


def verify_bytes(d: Dims, tokens: int, rows: int, itemsize: int, g: Geometry, attention: bool = True,
                 aux_width: int = 0) -> int:
    """The target's verify forward: its layers, or its logits ([T, vocab] in the dtype, then in fp32)."""
    t, s = tokens, itemsize
    end = t * d.hidden * s + t * d.vocab * (s + FP32)
    return max(layer_bytes(d, t, rows, s, g, attention), end) + aux_width * t * s


def draft_bytes(d: Dims, tokens: int, rows: int, itemsize: int, g: Geometry, attention: bool = True,
                fc_in: int | None = None) -> int:
    """A drafter forward: fc over [embeddings | target features], its layer, `rows` rows of logits + sampling."""
    t, s, h = tokens, itemsize, d.hidden
    fc_in = fc_in if fc_in is not None else 2 * h
    fuse = t * s * (h + fc_in + h)
    emit = rows * d.vocab * (s + DRAFT_SAMPLING_COPIES * FP32)
    return t * h * s + max(fuse, layer_bytes(d, t, rows, s, g, attention), emit)


def pieces_bytes(d: Dims, tokens: int, itemsize: int) -> int:
    """What a PIECEWISE graph keeps alive: per layer the captured q, k, v and the attention output it writes."""
    per_layer = tokens * (d.heads + 2 * d.kv_heads) * d.head_dim + (tokens + 1) * d.heads * d.head_dim
    return d.layers * per_layer * itemsize
