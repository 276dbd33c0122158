"""The target model: transformers' Llama modules driven over the paged cache.

We run the embedding, rotary embedding, decoder layers and final norm of a
`LlamaForCausalLM` ourselves instead of `LlamaModel.forward`: that skips mask
creation (a host sync) and any cache object, passes the attention metadata
to every layer so `paged_attention` can read it, and runs each layer in the
fused ops of `decoder_layer` (transformers' math, fewer kernels).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from parity.models import fused_ops
from parity.models.decoder_layer import embed, layer_body, norm_input, rope_tables
from parity.models.fused_weights import FusedLayers
from parity.models.paged_attention import ATTN_IMPLEMENTATION, one_forward
from parity.models.recurrent import hybridize


def paged_config(config: LlamaConfig) -> LlamaConfig:
    """Route the config's attention through the paged implementation."""
    config._attn_implementation = ATTN_IMPLEMENTATION
    return config


class TargetModel(FusedLayers):
    """A Llama-family causal LM whose forward reads paged-attention metadata.

    `forward` returns the final-normed hidden states [T, h] (what EAGLE-1 consumes)
    and, for EAGLE-3, the hidden states entering `aux_layers` concatenated on the last dim
    in the order given ([T, len(aux_layers) * h]); id N (= num_hidden_layers) is the
    last layer's output before the final norm.
    """

    def __init__(self, hf_model: LlamaForCausalLM, aux_layers: tuple[int, ...] = ()):
        super().__init__()
        self.hf = hf_model
        self.config = hf_model.config
        self.aux_layers = tuple(aux_layers)
        self.fuse_layers()

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.hf.model.embed_tokens

    @property
    def lm_head(self) -> nn.Linear:
        return self.hf.lm_head

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> tuple[torch.Tensor, torch.Tensor | None]:
        model = self.hf.model
        hidden = embed(model.embed_tokens, input_ids)
        cos, sin = rope_tables(model.rotary_emb, hidden, positions)
        aux = {}
        num_layers = self.config.num_hidden_layers
        residual = None
        with one_forward():
            for idx, layer in enumerate(model.layers[:num_layers]):
                normed, residual = norm_input(layer, hidden, residual)
                if idx in self.aux_layers:
                    aux[idx] = residual     # the layer's input
                hidden, residual = layer_body(layer, normed, residual, cos, sin, meta)
        norm = model.norm
        hidden, residual = fused_ops.add_rms_norm(hidden, residual, norm.weight, norm.variance_epsilon)
        if num_layers in self.aux_layers:
            # Id N: the output of the last layer, before the final norm.
            aux[num_layers] = residual
        aux_hidden = torch.cat([aux[i] for i in self.aux_layers], dim=-1) if aux else None
        return hidden, aux_hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden).float()

    def decoder_layers(self) -> list[nn.Module]:
        return list(self.hf.model.layers[: self.config.num_hidden_layers])


def build_target(config: LlamaConfig, aux_layers: tuple[int, ...] = ()) -> TargetModel:
    """A randomly initialised target for `config`, in eval mode."""
    model = LlamaForCausalLM(paged_config(config))
    hybridize(model)
    return TargetModel(model.eval(), aux_layers)
