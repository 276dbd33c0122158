"""The EAGLE-1 draft head in its published layout.

`fc` maps concat(token embedding, target hidden) 2h -> h, then one Llama
decoder layer whose input layernorm is dropped; embeddings and lm_head are the
target's. Checkpoint keys: `fc.weight`, `layers.0.*` (no
`layers.0.input_layernorm`), optionally `embed_tokens.weight`.

`forward` (the engine's) runs the layer in the target's fused ops
(`decoder_layer`); the layer module's own forward (transformers') is what
training runs, and is the same math (bit for bit on the CPU).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from parity.models.decoder_layer import decoder_layer, embed, float_logits, rope_tables
from parity.models.fused_weights import FusedLayers


class Eagle1Head(FusedLayers):
    ROW_KERNELS = True

    def __init__(self, config: LlamaConfig, fc_bias: bool = False):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        layer = LlamaDecoderLayer(config, layer_idx=0)
        # NOTE: EAGLE-1 skips the first layer's input layernorm (the fc output
        # is already a mix of two normalised-scale signals).
        layer.input_layernorm = nn.Identity()
        self.layers = nn.ModuleList([layer])
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # Shared with the target at load time; never saved in the head's checkpoint.
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: nn.Linear | None = None
        self.fuse_layers()

    def share(self, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> "Eagle1Head":
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        return self

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                meta=None) -> torch.Tensor:
        """Draft hidden states [T, h] for tokens `input_ids` fused with target `hidden_states`.

        With `meta` the layer attends through the paged cache; without it, through
        whatever attention the config names, over one causal sequence.
        """
        embeds = embed(self.embed_tokens, input_ids)
        fused = self.fc(torch.cat((embeds, hidden_states.to(embeds.dtype)), dim=-1))
        cos, sin = rope_tables(self.rotary_emb, fused, positions)
        return decoder_layer(self.layers[0], fused, cos, sin, meta)

    def fuse_target_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The target features the drafter's hidden_states buffer holds (EAGLE-1: as they are)."""
        return features

    def logits(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        return float_logits(self.lm_head, draft_hidden)

    def decoder_layers(self) -> list[nn.Module]:
        return list(self.layers)

    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """Weights in the published EAGLE-1 layout (shared tensors left out)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith(("embed_tokens.", "lm_head.", "rotary_emb."))}
