"""Multi-token-prediction (MTP) draft heads on a Llama target, in two published layouts.

Data flow of MTP layer i (vLLM's deepseek_mtp / qwen3_next_mtp), per drafted token:

    x = fc(concat(norm_e(embed(token)), norm_h(hidden)))     [T, 2h] -> [T, h]
    y = decoder_layer_i(x)                                   (a Llama layer, paged attention, KV layer i)
    DeepSeek-V3/GLM:  hands on y (pre-norm); logits = shared_head.head(shared_head.norm(y))
    Qwen3-Next:       hands on norm(y);      logits = the target's lm_head(norm(y))

`hidden` is the target's final-normed features in the draft prefill and the head's
own output in later draft steps (as in EAGLE-1). DeepSeek layer i has its own
enorm/hnorm/eh_proj/shared_head; Qwen3-Next shares fc and its three norms, which
are zero-centred (weight w applied as 1 + w), across its layers.

Which layer a forward runs: the draft step index (0 in the draft prefill, j in
draft step j), modulo the number of layers: a one-layer head is reused for every
step, a K-layer head gives one layer per position. The index is a tensor, the
proposer's `draft_step` buffer (bound with `with_step_index`), never a host value:
every layer runs and the index selects one output, so a graph captured once
replays the right layer at every step (vLLM #48892 froze a host index at capture).
Every layer therefore writes its own KV layer at every drafted position.

`forward` runs each layer in the target's fused ops (`decoder_layer`); the modules'
own forwards (transformers') are the same math, bit for bit on the CPU.

Checkpoint keys (published names, `state_names`):
- DeepSeek: `model.layers.<N+i>.{enorm,hnorm,eh_proj,shared_head.norm,shared_head.head}.weight` and the
  layer's usual tensors; N = the config's num_hidden_layers, i < num_nextn_predict_layers; optionally
  `model.layers.<N+i>.embed_tokens.weight` (the target's, ignored).
- Qwen3-Next: `mtp.fc.weight`, `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
  `mtp.norm.weight`, `mtp.layers.<i>.*`.
"""

from __future__ import annotations

import copy
import inspect
import weakref

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from parity.models.decoder_layer import decoder_layer, embed, float_logits, rms_norm, rope_tables
from parity.models.fused_weights import FusedLayers

DEEPSEEK, QWEN3NEXT = "mtp-deepseek", "mtp-qwen3next"
LAYOUTS = (DEEPSEEK, QWEN3NEXT)
NUM_LAYERS_KEY = "num_nextn_predict_layers"


class ZeroCentredRMSNorm(LlamaRMSNorm):
    """Qwen3-Next's RMSNorm: the stored weight w scales by 1 + w (zeros: the identity gain)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return ((1.0 + self.weight.float()) * x).to(dtype)


class MtpHead(FusedLayers):
    ROW_KERNELS = True

    def __init__(self, config: LlamaConfig, layout: str):
        """`config.num_hidden_layers` is the number of MTP layers (the head's KV layers)."""
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown MTP layout {layout!r}")
        self.config, self.layout = config, layout
        h, eps, n = config.hidden_size, config.rms_norm_eps, config.num_hidden_layers
        self.blocks = nn.ModuleList(LlamaDecoderLayer(config, layer_idx=i) for i in range(n))
        per_layer = n if layout == DEEPSEEK else 1
        norm = LlamaRMSNorm if layout == DEEPSEEK else ZeroCentredRMSNorm
        self.enorm = nn.ModuleList(norm(h, eps=eps) for _ in range(per_layer))
        self.hnorm = nn.ModuleList(norm(h, eps=eps) for _ in range(per_layer))
        self.eh_proj = nn.ModuleList(nn.Linear(2 * h, h, bias=False) for _ in range(per_layer))
        self.final_norm = nn.ModuleList(norm(h, eps=eps) for _ in range(per_layer))
        # DeepSeek: each layer's shared_head.head; Qwen3-Next: the target's lm_head (`share`).
        self.heads = nn.ModuleList(nn.Linear(h, config.vocab_size, bias=False)
                                   for _ in range(per_layer if layout == DEEPSEEK else 0))
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.embed_tokens: nn.Embedding | None = None
        self.target_lm_head: nn.Linear | None = None
        self._step_index = None
        self.fuse_layers()

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def fc(self) -> nn.Linear:
        """The first layer's input projection (the engine reads the head's dtype from `fc`)."""
        return self.eh_proj[0]

    @property
    def lm_head(self) -> nn.Linear:
        """The output projection (the engine sizes its vocabulary-wide buffers from it)."""
        return self.heads[0] if self.layout == DEEPSEEK else self.target_lm_head

    def share(self, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> "MtpHead":
        self.embed_tokens = embed_tokens
        if self.layout == QWEN3NEXT:
            self.target_lm_head = lm_head
        return self

    def with_step_index(self, source) -> "MtpHead":
        """This head (the same modules and weights) reading its step index from `source()`, an int64 tensor [1]
        (one proposer's `draft_step` buffer): each engine gets its own, so two engines can share the weights.

        A bound method is held weakly: the proposer holds this head, and a cycle back to it would keep the
        engine (its KV cache, its graphs) alive after a run gives it back, until a garbage collection.
        """
        bound = copy.copy(self)
        bound._step_index = weakref.WeakMethod(source) if inspect.ismethod(source) else (lambda: source)
        return bound

    def layer_index(self) -> torch.Tensor:
        """Which layer this forward runs: the step index modulo the number of layers, a tensor [1]."""
        if self._step_index is None:
            raise RuntimeError("a multi-layer MTP head needs its step index (with_step_index)")
        return torch.remainder(self._step_index()(), self.num_layers)

    def _select(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        if len(outputs) == 1:
            return outputs[0]
        return torch.stack(outputs).index_select(0, self.layer_index())[0]

    def _part(self, modules: nn.ModuleList, i: int) -> nn.Module:
        return modules[i if len(modules) > 1 else 0]

    def _layer(self, i: int, embeds, hidden, cos, sin, meta) -> torch.Tensor:
        x = torch.cat((rms_norm(self._part(self.enorm, i), embeds), rms_norm(self._part(self.hnorm, i), hidden)),
                      dim=-1)
        out = decoder_layer(self.blocks[i], self._part(self.eh_proj, i)(x), cos, sin, meta)
        return self._part(self.final_norm, i)(out) if self.layout == QWEN3NEXT else out

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                meta=None) -> torch.Tensor:
        """Draft hidden states [T, h]: the selected layer's output (the next step's hidden input)."""
        embeds = embed(self.embed_tokens, input_ids)
        if self.layout == DEEPSEEK:   # DeepSeek's MTP reads no token at position 0 (as vLLM's deepseek_mtp)
            embeds = torch.where((positions == 0).view(-1, 1), torch.zeros_like(embeds), embeds)
        hidden = hidden_states.to(embeds.dtype)
        cos, sin = rope_tables(self.rotary_emb, embeds, positions)
        return self._select([self._layer(i, embeds, hidden, cos, sin, meta) for i in range(self.num_layers)])

    def fuse_target_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The target features the drafter's hidden_states buffer holds (MTP: as they are)."""
        return features

    def logits(self, draft_hidden: torch.Tensor) -> torch.Tensor:
        """[n, vocab] fp32 logits of the selected layer's output."""
        if self.layout == QWEN3NEXT:
            return float_logits(self.target_lm_head, draft_hidden)
        return self._select([float_logits(head, norm(draft_hidden))
                             for head, norm in zip(self.heads, self.final_norm)])

    def decoder_layers(self) -> list[nn.Module]:
        return list(self.blocks)

    def head_state_dict(self, base: int) -> dict[str, torch.Tensor]:
        """Weights in the published layout (shared tensors left out); `base`: DeepSeek's first MTP layer id."""
        names = published_names(self, base)
        return {names[k]: v for k, v in self.state_dict().items() if k in names}


def published_names(head: MtpHead, base: int) -> dict[str, str]:
    """Internal state_dict key -> published checkpoint key, for every weight the checkpoint holds."""
    if head.layout == DEEPSEEK:
        parts = {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "final_norm": "shared_head.norm",
                 "heads": "shared_head.head"}
        layer = lambda i: f"model.layers.{base + i}."          # noqa: E731
    else:
        parts = {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc",
                 "final_norm": "norm"}
        layer = lambda i: "mtp." if i is None else f"mtp.layers.{i}."   # noqa: E731
    names = {}
    for key in head.state_dict():
        first, index, rest = (key.split(".", 2) + ["", ""])[:3]
        if first == "blocks":
            names[key] = layer(int(index)) + rest
        elif first in parts:
            names[key] = (layer(int(index)) if head.layout == DEEPSEEK else layer(None)) + parts[first] + "." + rest
    return names
