"""The recipe of a synthetic pair: random weights whose draft is the target's bigram.

- Every tensor is drawn on the target device, in the requested dtype, from its
  own `torch.Generator` seeded by (seed, tensor name): no fp32 copy of the model
  ever exists, and any tensor can be redrawn alone (calibration redraws the
  target's branch outputs at each scale it tries).
- Target: Llama's init (normal, std 0.02; norms 1) except that `o_proj` and
  `down_proj` are scaled by `scale`, so the residual stream stays close to the
  token embedding and the greedy next token is mostly the bigram
  argmax lm_head(norm(embed(token))); calibration picks `scale` for the
  requested agreement. Output rows (lm_head, or the tied embeddings) of tokens
  outside a seeded "frequent" set are damped by RARE_TOKEN_GAIN, like the low
  prior of rare tokens in a real model, so bigram targets fall in that set,
  which is the EAGLE-3 draft vocabulary.
- Tied embeddings (Llama-3.2-1B): lm_head(norm(embed(x))) peaks at x itself
  and its scores are symmetric, so that bigram would be the identity (or
  2-cycles) and every continuation would repeat itself. Layer 0's MLP therefore
  stays unscaled (calibration scales every other branch), its output sized to
  rms INIT_STD x sqrt(h), large enough to outweigh e's match with itself at
  every hidden size: the residual stream carries MLP0(token) and the bigram
  argmax lm_head(norm(e + MLP0(norm(e)))), e = embed(x), is a random map; the
  heads copy layer 0's MLP into their layer to draft it.
- EAGLE-1 head: fc = [I, noise] passes the token embedding through; the layer's
  down_proj is scaled by HEAD_BRANCH_SCALE (or holds MLP0) and its o_proj sized
  so that attention adds HEAD_ATTN_MIX of the embedding's size, so the draft
  lm_head(layer(fc(...))) is the bigram but for a context term that drafter
  attention-metadata faults move.
- EAGLE-3 head: its token enters only through attention, so q = k = gain x
  norm(e) (the softmax concentrates on positions holding the same token),
  v = norm(e), o_proj = INIT_STD x I (an embedding's size again); the residual
  is the normed hidden input damped to HIDDEN_MIX of that; the MLP as in
  EAGLE-1. The draft is the bigram restricted to the frequent set.
Both heads keep a small (HIDDEN_MIX) dependence on the target features, so a
stale or misplaced hidden-states buffer still moves draft logprobs.
"""

from __future__ import annotations

import hashlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.models.eagle1 import Eagle1Head
from parity.models.eagle3 import Eagle3Head
from parity.models.recurrent import hybridize
from parity.builders.synth.spec import SynthShape

INIT_STD = 0.02             # Llama's initializer_range
HEAD_BRANCH_SCALE = 1e-4    # the head's MLP output: nearly nothing
HEAD_ATTN_MIX = 0.05        # the EAGLE-1 head's attention output, relative to the embedding it passes on
HIDDEN_MIX = 0.01           # size of the target-feature part of the head's output, relative to the token's
RARE_TOKEN_GAIN = 0.5       # output rows of tokens outside the frequent set
ATTN_GAIN = 8 ** 0.5        # EAGLE-3 q/k: a self score of 8 sqrt(head_dim) against noise of std 8
BRANCH_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def normal(size, std: float, seed: int, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """N(0, std^2) drawn directly in `dtype` on `device` from the generator of (seed, name)."""
    return torch.empty(size, dtype=dtype, device=device).normal_(0.0, std, generator=_generator(seed, name, device))


def frequent_ids(shape: SynthShape, seed: int) -> torch.Tensor:
    """The frequent tokens (sorted target ids; the EAGLE-3 draft vocabulary), the same on every device."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(shape.vocab_size, generator=generator)[: shape.draft_vocab_size].sort().values


def _row_gain(vocab: int, frequent: torch.Tensor, dtype, device) -> torch.Tensor:
    gain = torch.full((vocab, 1), RARE_TOKEN_GAIN, dtype=dtype, device=device)
    gain[frequent.to(device)] = 1.0
    return gain


def _output_rows_name(shape: SynthShape) -> str:
    return "model.embed_tokens.weight" if shape.tie_word_embeddings else "lm_head.weight"


FIRST_MLP = "model.layers.0.mlp."


def keeps_first_mlp(shape: SynthShape) -> bool:
    """Whether layer 0's MLP keeps Llama's init (tied embeddings; see the module docstring)."""
    return shape.tie_word_embeddings


def _scaled(name: str, shape: SynthShape) -> bool:
    return name.endswith(BRANCH_OUTPUTS) and not (keeps_first_mlp(shape) and name.startswith(FIRST_MLP))


def target_tensor(name: str, size, shape: SynthShape, seed: int, scale: float, frequent: torch.Tensor,
                  dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One target weight by the recipe (see the module docstring)."""
    if name.endswith("norm.weight"):
        return torch.ones(size, dtype=dtype, device=device)
    tensor = normal(size, INIT_STD * (scale if _scaled(name, shape) else 1.0), seed, name, dtype, device)
    if name == _output_rows_name(shape):
        tensor.mul_(_row_gain(shape.vocab_size, frequent, dtype, device))
    return tensor


def build_target(shape: SynthShape, config: LlamaConfig, seed: int, scale: float, frequent: torch.Tensor,
                 dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """A LlamaForCausalLM with the recipe's weights, built on the meta device and filled on `device`."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
        hybridize(model)      # a hybrid target's recurrent layers: their o_proj is scaled like attention's
    state = {}
    for name, meta in model.state_dict().items():
        if shape.tie_word_embeddings and name == "lm_head.weight":
            continue
        state[name] = target_tensor(name, meta.shape, shape, seed, scale, frequent, dtype, device)
    if shape.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if shape.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # RoPE inverse frequencies are non-persistent buffers, still on meta: compute them.
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)
    if keeps_first_mlp(shape):
        _size_first_mlp(model, frequent)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def _size_first_mlp(model: LlamaForCausalLM, frequent: torch.Tensor) -> None:
    """Rescale layer 0's down_proj so that MLP0(norm(e)) has rms INIT_STD x sqrt(h) over frequent tokens."""
    layer = model.model.layers[0]
    embeds = model.model.embed_tokens.weight[frequent[:1024].to(layer.mlp.down_proj.weight.device)]
    rms = layer.mlp(layer.post_attention_layernorm(embeds)).float().pow(2).mean().sqrt()
    layer.mlp.down_proj.weight.mul_(float(INIT_STD * embeds.shape[-1] ** 0.5 / rms))


@torch.no_grad()
def set_branch_scale(model: LlamaForCausalLM, shape: SynthShape, seed: int, scale: float) -> None:
    """Redraw the target's scaled o_proj/down_proj at `scale` (the same draws, rescaled)."""
    for name, param in model.named_parameters():
        if _scaled(name, shape):
            param.normal_(0.0, INIT_STD * scale, generator=_generator(seed, name, param.device))


@torch.no_grad()
def branch_free_residual(model: LlamaForCausalLM, shape: SynthShape, ids: torch.Tensor) -> torch.Tensor:
    """The target's residual stream for `ids` after its last layer, every scaled branch off (before the norm)."""
    hidden = model.model.embed_tokens(ids)
    if keeps_first_mlp(shape):
        layer = model.model.layers[0]
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return hidden


@torch.no_grad()
def branch_free_hidden(model: LlamaForCausalLM, shape: SynthShape, ids: torch.Tensor) -> torch.Tensor:
    """The target's final hidden state for `ids` with every scaled branch off: what the heads draft from."""
    return model.model.norm(branch_free_residual(model, shape, ids))


def _pass_through(size, gain: float, dtype, device) -> torch.Tensor:
    """[out, in] zeros with gain x identity on the first `out` input columns (the embedding half)."""
    tensor = torch.zeros(size, dtype=dtype, device=device)
    tensor[:, : size[0]].diagonal().fill_(gain)
    return tensor


def _head_layer_tensor(name: str, size, shape: SynthShape, target: LlamaForCausalLM, seed: int,
                       dtype, device) -> torch.Tensor:
    if keeps_first_mlp(shape) and ".mlp." in name:
        return getattr(target.model.layers[0].mlp, name.split(".mlp.")[1].removesuffix(".weight")).weight.clone()
    if name.endswith("norm.weight"):
        return torch.ones(size, dtype=dtype, device=device)
    std = INIT_STD * (HEAD_BRANCH_SCALE if name.endswith("mlp.down_proj.weight") else 1.0)
    return normal(size, std, seed, "head/" + name, dtype, device)


@torch.no_grad()
def eagle1_state(config: LlamaConfig, shape: SynthShape, target: LlamaForCausalLM, seed: int, tokens: torch.Tensor,
                 dtype, device, scale: float = 1.0, gain: float = 1.0) -> dict[str, torch.Tensor]:
    """The EAGLE-1 head's checkpoint tensors (published names), drafting the target's bigram.

    `tokens` [B, T]: sequences on which the attention's o_proj is sized (`_size_eagle1_attention`).
    `scale`: the target's final norm weight (peak.py); `gain`: the head's output scale that matches it.
    Every branch of the layer is `gain` times the unit recipe's, so its output, the next step's hidden
    input as the target's features are, is too; q and k are divided by it, so attention weights are
    the unit recipe's.
    """
    with torch.device("meta"):
        layout = Eagle1Head(config).head_state_dict()
    h = config.hidden_size
    state = {}
    for name, meta in layout.items():
        if name == "fc.weight":
            # The hidden half sees the target's final-normed features (rms ~1); the embedding
            # half a token embedding (rms INIT_STD): noise of this std mixes in HIDDEN_MIX of it.
            # NOTE: the hidden half reads features of rms `scale`: the noise keeps HIDDEN_MIX of gain x embedding.
            std = HIDDEN_MIX * INIT_STD / h ** 0.5 * (gain / scale)
            tensor = normal(meta.shape, std, seed, "head/" + name, dtype, device)
            tensor[:, :h] = _pass_through((h, h), gain, dtype, device)
        else:
            tensor = _head_layer_tensor(name, meta.shape, shape, target, seed, dtype, device)
            if gain != 1.0 and name.endswith(("q_proj.weight", "k_proj.weight")):
                tensor.div_(gain)
            elif gain != 1.0 and name.endswith("down_proj.weight"):
                tensor.mul_(gain)
        state[name] = tensor
    _size_eagle1_attention(state, config, target, tokens, gain)
    return state


def _size_eagle1_attention(state: dict[str, torch.Tensor], config: LlamaConfig, target: LlamaForCausalLM,
                           tokens: torch.Tensor, gain: float) -> None:
    """Rescale the head's o_proj so its attention output has HEAD_ATTN_MIX of gain x the embeddings' rms.

    NOTE: the head reads un-normalised embeddings (no input layernorm), so with Llama's init its
    attention output would be ~0 at hidden 128 and as large as the embedding at 4096; sized by
    measurement it moves drafts little at every shape, yet enough that the drafter's
    attention-metadata faults change drafts.
    """
    config = LlamaConfig.from_dict(config.to_dict())
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        head = Eagle1Head(config)
    head.load_state_dict(state, strict=True, assign=True)     # aliases `state`: o_proj is scaled in place
    head.rotary_emb = LlamaRotaryEmbedding(config).to(tokens.device)
    embeds = target.model.embed_tokens(tokens)
    hidden = target.model(input_ids=tokens, use_cache=False).last_hidden_state
    fused = head.fc(torch.cat((embeds, hidden), dim=-1))
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    attn, _ = head.layers[0].self_attn(hidden_states=fused, attention_mask=None,
                                       position_embeddings=head.rotary_emb(fused, position_ids=positions))
    rms = lambda x: x.float().pow(2).mean().sqrt()   # noqa: E731
    state["layers.0.self_attn.o_proj.weight"].mul_(float(HEAD_ATTN_MIX * gain * rms(embeds) / rms(attn)))


EAGLE3_FIXED = {   # published name -> gain of the identity on the embedding half
    "midlayer.self_attn.q_proj.weight": ATTN_GAIN, "midlayer.self_attn.k_proj.weight": ATTN_GAIN,
    "midlayer.self_attn.v_proj.weight": 1.0, "midlayer.self_attn.o_proj.weight": INIT_STD,
}


@torch.no_grad()
def eagle3_state(config: LlamaConfig, shape: SynthShape, target: LlamaForCausalLM, frequent: torch.Tensor,
                 seed: int, dtype, device, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The EAGLE-3 head's checkpoint tensors (published names), drafting the bigram over `frequent`;
    its final norm weight is the target's, `scale` (peak.py)."""
    with torch.device("meta"):
        layout = Eagle3Head(config).head_state_dict()
    state = {}
    for name, meta in layout.items():
        if name in EAGLE3_FIXED:
            tensor = _pass_through(meta.shape, EAGLE3_FIXED[name], dtype, device)
        elif name == "midlayer.hidden_norm.weight":
            tensor = torch.full(meta.shape, HIDDEN_MIX * INIT_STD, dtype=dtype, device=device)
        elif name == "norm.weight":
            tensor = torch.full(meta.shape, scale, dtype=dtype, device=device)
        elif name == "lm_head.weight":
            tensor = target.lm_head.weight[frequent.to(device)].clone()
        elif name == "d2t":
            tensor = frequent - torch.arange(frequent.numel())
        elif name == "t2d":
            tensor = torch.zeros(meta.shape, dtype=torch.bool)
            tensor[frequent] = True
        else:
            tensor = _head_layer_tensor(name, meta.shape, shape, target, seed, dtype, device)
        state[name] = tensor
    return state
