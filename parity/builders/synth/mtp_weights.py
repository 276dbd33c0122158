"""The recipe of a synthetic MTP head (models/mtp.py): every layer drafts the target's bigram.

Each MTP layer i gets the EAGLE-1 head's recipe (weights.py), adapted to an MTP
layer's input norms: its fc (`eh_proj` / `mtp.fc`) passes the normed token
embedding through at gain INIT_STD (an embedding's size again, so a copied
layer-0 MLP of a tied shape sees what it expects) and mixes in HIDDEN_MIX of
that from the normed hidden input; its decoder layer is drawn as the EAGLE-1
head's (MLP output nearly nothing, or layer 0's MLP), with the attention output
sized by measurement to HEAD_ATTN_MIX of the layer's input. Norms are the
identity gain (ones; zeros for Qwen3-Next's zero-centred ones) but the final
norm's, which is the target's final norm weight (its logit scale, peak.py);
DeepSeek's `shared_head.head` is a copy of the target's lm_head. So layer i, fed the draft
token of step i - 1, drafts that token's bigram: a K-layer head's later
positions are accepted like a chain EAGLE head's, they do not collapse.
Each tensor is drawn from the generator of (seed, its published name).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.builders.synth.spec import SynthShape
from parity.builders.synth.weights import (HEAD_ATTN_MIX, HIDDEN_MIX, INIT_STD, _head_layer_tensor, _pass_through,
                                           normal)
from parity.models.mtp import QWEN3NEXT, MtpHead, published_names


def _internal_tensor(key: str, name: str, size, layout: str, shape: SynthShape, target: LlamaForCausalLM,
                     seed: int, dtype, device, scale: float) -> torch.Tensor:
    first = key.split(".", 1)[0]
    if first in ("enorm", "hnorm", "final_norm"):
        gain = scale if first == "final_norm" else 1.0     # the final norm's weight is the target's (peak.py)
        return torch.full(size, gain - 1.0 if layout == QWEN3NEXT else gain, dtype=dtype, device=device)
    if first == "eh_proj":
        h = size[0]
        tensor = normal(size, HIDDEN_MIX * INIT_STD / h ** 0.5, seed, "head/" + name, dtype, device)
        tensor[:, :h] = _pass_through((h, h), INIT_STD, dtype, device)
        return tensor
    if first == "heads":
        return target.lm_head.weight.detach().clone().to(dtype)
    return _head_layer_tensor(name, size, shape, target, seed, dtype, device)


@torch.no_grad()
def mtp_state(config: LlamaConfig, layout: str, shape: SynthShape, target: LlamaForCausalLM, seed: int,
              tokens: torch.Tensor, dtype, device, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The MTP head's checkpoint tensors (published names); `config`: the head's published config;
    `scale`: the target's final norm weight, which each layer's final norm gets too."""
    layers = config.num_nextn_predict_layers
    head_config = LlamaConfig.from_dict({**config.to_dict(), "num_hidden_layers": layers})
    head_config._attn_implementation = "sdpa"
    with torch.device("meta"):
        head = MtpHead(head_config, layout)
    names = published_names(head, config.num_hidden_layers)
    internal = {key: _internal_tensor(key, names[key], meta.shape, layout, shape, target, seed, dtype, device,
                                      scale) for key, meta in head.state_dict().items()}
    head.load_state_dict(internal, strict=True, assign=True)   # aliases `internal`: o_proj is sized in place
    head.rotary_emb = LlamaRotaryEmbedding(head_config).to(device)
    _size_attention(head, target, tokens)
    return {names[key]: value for key, value in internal.items()}


def _size_attention(head: MtpHead, target: LlamaForCausalLM, tokens: torch.Tensor) -> None:
    """Rescale each layer's o_proj so its attention output has HEAD_ATTN_MIX of the layer input's rms."""
    embeds = target.model.embed_tokens(tokens)
    hidden = target.model(input_ids=tokens, use_cache=False).last_hidden_state
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    rms = lambda x: x.float().pow(2).mean().sqrt()   # noqa: E731
    for i, block in enumerate(head.blocks):
        x = head._part(head.eh_proj, i)(torch.cat((head._part(head.enorm, i)(embeds),
                                                  head._part(head.hnorm, i)(hidden)), dim=-1))
        rope = head.rotary_emb(x, position_ids=positions)
        attn, _ = block.self_attn(hidden_states=block.input_layernorm(x), attention_mask=None,
                                  position_embeddings=rope)
        block.self_attn.o_proj.weight.mul_(float(HEAD_ATTN_MIX * rms(x) / rms(attn)))
