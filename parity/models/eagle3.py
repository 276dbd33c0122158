"""The EAGLE-3 draft head in its published layout (yuhuili/EAGLE3-*, vLLM's llama_eagle3).

Data flow, per drafted token:

    target aux features [T, 3h]  (hidden states entering target layers `aux_layer_ids`)
      -> fuse_target_hidden: fc 3h -> h        (eager, outside the drafter's graphs)
    hidden [T, h] (fused features, or the head's own output in later draft steps)
    embeds = embed_tokens(input_ids)           (the target's embeddings, shared)
      -> midlayer: q/k/v over concat(input_layernorm(embeds), hidden_norm(hidden)) [.., 2h],
                   residual = hidden, then post_attention_layernorm + SwiGLU MLP
    forward() returns the pre-norm output [T, h]: the next draft step's hidden input
      -> own_logits(): norm, lm_head [draft_vocab, h]: what drafting samples from, the drafted
                   id mapped through d2t (target id = draft id + d2t[draft id]);
         logits(): the same scattered into the target vocabulary (other ids -inf)

NOTE: the fusion runs eagerly in the engine (`SpecDecodeEngine._draft` copies
`fuse_target_hidden(features)` into the drafter's `hidden_states` buffer before
the draft prefill), so every drafter graph starts from an [T, h] buffer, as the
EAGLE-1 graphs do, and the draft decode steps (whose hidden input is the head's
own output) need no fc at all. vLLM splits it the same way (`combine_hidden_states`).

`forward` (the engine's, [T, h]) runs the layer in the target's fused ops (`decoder_layer`:
both input norms and their concat as one op, one q/k/v GEMM over the 2h concat, one gate/up
GEMM, the residual add fused with the post-attention norm, the down projection adding the last
residual itself); `layer_forward` ([B, T, h], what training runs) runs the modules,
transformers' math, which the fused path equals bit for bit on the CPU.

Checkpoint keys: `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`midlayer.self_attn.{q,k,v,o}_proj.weight`, `midlayer.mlp.{gate,up,down}_proj.weight`,
`fc.weight`, `norm.weight`, `lm_head.weight`, `d2t` (int64 [draft_vocab]),
`t2d` (bool [target vocab]), optionally `embed_tokens.weight`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from parity.models.decoder_layer import (embed, float_logits, layer_output, rms_norm, rms_norm_pair,
                                         rope_tables)
from parity.models.fused_weights import FusedLayers

NUM_AUX_LAYERS = 3
AUX_IDS_KEY = "eagle_aux_hidden_state_layer_ids"


def aux_layer_ids(config: LlamaConfig, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose entering hidden states the head fuses.

    From the head config's `eagle_aux_hidden_state_layer_ids` (top level or inside
    `eagle_config`) when present, else vLLM's default for Llama: (2, N//2, N-3).
    Id i means "entering layer i"; id N means the last layer's output (pre-norm).
    """
    ids = getattr(config, AUX_IDS_KEY, None)
    eagle_config = getattr(config, "eagle_config", None)
    if ids is None and isinstance(eagle_config, dict):
        ids = eagle_config.get(AUX_IDS_KEY)
    if ids is None:
        n = num_target_layers
        ids = (2, n // 2, n - 3)
    return tuple(int(i) for i in ids)


def draft_vocab_size(config: LlamaConfig) -> int:
    return int(getattr(config, "draft_vocab_size", None) or config.vocab_size)


class Eagle3DecoderLayer(nn.Module):
    """transformers' Llama attention/MLP/RMSNorm arranged as EAGLE-3's first layer.

    The attention is a stock `LlamaAttention` (so it goes through the attention
    interface named by `config._attn_implementation`: the paged attention in the
    engine) whose q/k/v projections take the 2h-wide concat.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * h, proj.out_features, bias=proj.bias is not None))
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        # Some EAGLE-3 checkpoints (speculators) take the residual after hidden_norm.
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                position_embeddings, **attn_kwargs) -> torch.Tensor:
        """[B, T, h] embeds and hidden -> [B, T, h] pre-norm output."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat((self.input_layernorm(embeds), normed), dim=-1)
        attn, _ = self.self_attn(hidden_states=x, attention_mask=None, position_ids=position_ids,
                                 position_embeddings=position_embeddings, **attn_kwargs)
        hidden = residual + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def fused_forward(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      meta) -> torch.Tensor:
        """`forward` in the fused ops: [T, h] embeds and hidden, RoPE's [T, D] cos/sin -> [T, h]."""
        # Both norms and their concat as one op (one kernel on CUDA); the normed hidden input is its right half.
        x = rms_norm_pair(self.input_layernorm, embeds, self.hidden_norm, hidden)
        residual = x[:, hidden.shape[-1]:] if self.norm_before_residual else hidden
        return layer_output(self, x, residual, cos, sin, meta)


class DraftVocabLMHead(nn.Module):
    """lm_head over the draft vocabulary whose logits come out in the target vocabulary.

    `proj` is the published `lm_head.weight` [draft_vocab, h]; `d2t` maps draft id i
    to target id i + d2t[i]; `t2d` marks the target ids that have a draft id.
    """

    def __init__(self, hidden_size: int, draft_vocab: int, target_vocab: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(target_vocab, dtype=torch.bool)
                             if draft_vocab == target_vocab else torch.zeros(target_vocab, dtype=torch.bool))

    @property
    def target_vocab_size(self) -> int:
        return self.t2d.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        """A [target_vocab, h] stride-0 view of the first draft row (no memory).

        NOTE: the engine sizes its vocabulary-wide buffers (draft probabilities) from
        `head.lm_head.weight.shape[0]`, which must be the target vocabulary because
        `logits()` returns target-vocabulary logits; the real weight is `proj.weight`.
        """
        return self.proj.weight[:1].expand(self.target_vocab_size, -1)

    def target_ids(self) -> torch.Tensor:
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def draft(self, normed: torch.Tensor) -> torch.Tensor:
        """[N, h] -> [N, V_draft] float logits over the draft vocabulary."""
        return float_logits(self.proj, normed)

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        """[N, h] -> [N, V_target] float logits; target ids outside the draft vocabulary get -inf."""
        return self.logits_to_target(self.draft(normed))

    def logits_to_target(self, draft: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [N, V_draft] -> over the target's [N, V_target] (-inf elsewhere)."""
        return self._in_target(draft, float("-inf"))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids [N] -> their target ids [N]."""
        return draft_ids + self.d2t[draft_ids]

    def distribution_to_target(self, probs: torch.Tensor) -> torch.Tensor:
        """A distribution over the draft vocabulary [N, V_draft] -> over the target's [N, V_target] (0 elsewhere)."""
        return self._in_target(probs, 0.0)

    def _in_target(self, values: torch.Tensor, elsewhere: float) -> torch.Tensor:
        """[N, V_draft] values placed at their target ids of an [N, V_target] tensor holding `elsewhere`."""
        out = values.new_full((values.shape[0], self.target_vocab_size), elsewhere)
        return out.index_copy_(1, self.target_ids(), values)


class Eagle3Head(FusedLayers):
    ROW_KERNELS = True

    def __init__(self, config: LlamaConfig, target_hidden_size: int | None = None):
        super().__init__()
        self.config = config
        h = config.hidden_size
        target_h = target_hidden_size or getattr(config, "target_hidden_size", None) or h
        self.fc = nn.Linear(NUM_AUX_LAYERS * target_h, h, bias=False)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = DraftVocabLMHead(h, draft_vocab_size(config), config.vocab_size)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # The target's, unless the checkpoint carries its own (see `loader.load_eagle3`).
        self.embed_tokens: nn.Embedding | None = None
        self.fuse_layers()

    def share(self, embed_tokens: nn.Embedding) -> "Eagle3Head":
        self.embed_tokens = embed_tokens
        return self

    def layer_forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                      **attn_kwargs) -> torch.Tensor:
        """[B, T, h] embeds and hidden, [B, T] positions -> [B, T, h], through the modules (what training runs)."""
        hidden = hidden.to(embeds.dtype)
        rope = self.rotary_emb(hidden, position_ids=position_ids)
        return self.midlayer(embeds, hidden, position_ids, rope, **attn_kwargs)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                meta=None) -> torch.Tensor:
        """Draft hidden states [T, h] (pre-norm: the next step's hidden input).

        `hidden_states` are fused target features (draft prefill) or the head's own
        outputs (draft steps). With `meta` the layer attends through the paged cache.
        """
        embeds = embed(self.embed_tokens, input_ids)
        hidden = hidden_states.to(embeds.dtype)
        cos, sin = rope_tables(self.rotary_emb, hidden, positions)
        return self.midlayer.fused_forward(embeds, hidden, cos, sin, meta)

    def fuse_target_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """fc over the target's auxiliary hidden states: [T, 3h] -> [T, h] (run eagerly by the engine)."""
        return self.fc(features.to(self.fc.weight.dtype))

    def logits(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the target vocabulary [N, V_target] (ids outside the draft vocabulary -inf)."""
        return self.lm_head(rms_norm(self.norm, draft_hidden))

    def own_logits(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [N, V_draft]: what drafting reduces over (`lm_head.to_target` maps
        its ids), a quarter of the target vocabulary at Llama 3's 32k of 128k."""
        return self.lm_head.draft(rms_norm(self.norm, draft_hidden))

    @property
    def vocab(self) -> DraftVocabLMHead:
        """The map from the draft vocabulary to the target's (`to_target`, `logits_to_target`,
        `distribution_to_target`)."""
        return self.lm_head

    def decoder_layers(self) -> list[nn.Module]:
        return [self.midlayer]

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights in the published EAGLE-3 layout (the shared embeddings left out)."""
        out = {}
        for key, value in self.state_dict().items():
            if key.startswith(("embed_tokens.", "rotary_emb.")):
                continue
            out[PUBLISHED_NAMES.get(key, key)] = value
        return out


# internal state_dict key -> published checkpoint key (others are the same)
PUBLISHED_NAMES = {"lm_head.proj.weight": "lm_head.weight", "lm_head.d2t": "d2t", "lm_head.t2d": "t2d"}
INTERNAL_NAMES = {v: k for k, v in PUBLISHED_NAMES.items()}
