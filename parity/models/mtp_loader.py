"""Reading MTP heads (models/mtp.py) from their published layouts.

An MTP head's tensors live beside the target's in the published checkpoints
(DeepSeek-V3: `model.layers.<N+i>.*`; Qwen3-Next: `mtp.*`), so the draft folder
may be the target's own folder: only the MTP tensors are read as the head, and
the target loader leaves them out (`drop_mtp_tensors`). A folder holding only
the head (what `parity models synth` writes) reads the same way. Every problem
is one `ParityInputError` line that names the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.errors import ParityInputError
from parity.models.checkpoint import assign_weights, check_keys
from parity.models.llama import paged_config
from parity.models.mtp import DEEPSEEK, NUM_LAYERS_KEY, QWEN3NEXT, MtpHead, published_names

EH_PROJ = re.compile(r"^model\.layers\.(\d+)\.eh_proj\.weight$")
QWEN_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


def mtp_layout(state: dict[str, torch.Tensor]) -> str | None:
    """DEEPSEEK or QWEN3NEXT when the tensors hold an MTP head, else None."""
    if any(k.startswith("mtp.") for k in state):
        return QWEN3NEXT
    if any(EH_PROJ.match(k) for k in state):
        return DEEPSEEK
    return None


def num_mtp_layers(layout: str, raw: dict, state: dict[str, torch.Tensor], file: Path) -> int:
    """The number of MTP layers: the config's num_nextn_predict_layers, checked against the tensors."""
    base = raw["num_hidden_layers"] if isinstance(raw.get("num_hidden_layers"), int) else None
    if layout == DEEPSEEK:
        if base is None:
            raise ParityInputError(f"{file}: a DeepSeek-layout MTP head needs num_hidden_layers in config.json "
                                   f"(its layers are model.layers.<num_hidden_layers + i>)")
        found = sorted(int(m.group(1)) - base for k in state if (m := EH_PROJ.match(k)))
    else:
        found = sorted({int(m.group(1)) for k in state if (m := QWEN_LAYER.match(k))})
    layers = raw.get(NUM_LAYERS_KEY, len(found))
    if found != list(range(layers)):
        where = "model.layers.<num_hidden_layers + i>.eh_proj" if layout == DEEPSEEK else "mtp.layers.<i>"
        raise ParityInputError(f"{file}: {NUM_LAYERS_KEY} is {layers} but the checkpoint's MTP layers "
                               f"({where}) are i = {found or 'none'} (expected 0..{layers - 1})")
    return layers


def _prefixes(layout: str, base: int, layers: int) -> tuple[str, ...]:
    if layout == QWEN3NEXT:
        return ("mtp.",)
    return tuple(f"model.layers.{base + i}." for i in range(layers))


def select_mtp_tensors(layout: str, raw: dict, state: dict[str, torch.Tensor],
                       file: Path) -> dict[str, torch.Tensor]:
    """Only the head's tensors (a full checkpoint's target tensors left out, and DeepSeek's embed copy)."""
    layers = num_mtp_layers(layout, raw, state, file)
    prefixes = _prefixes(layout, raw.get("num_hidden_layers", 0), layers)
    return {k: v for k, v in state.items() if k.startswith(prefixes)
            and not k.endswith((".embed_tokens.weight", ".shared_head.embed_tokens.weight"))}


def drop_mtp_tensors(state: dict[str, torch.Tensor], config: LlamaConfig) -> dict[str, torch.Tensor]:
    """A target checkpoint without the MTP tensors published beside its own (the target never runs them)."""
    layers = getattr(config, NUM_LAYERS_KEY, None) or 0
    prefixes = ("mtp.",) + _prefixes(DEEPSEEK, config.num_hidden_layers, layers)
    return {k: v for k, v in state.items() if not k.startswith(prefixes)}


def build_mtp(layout: str, config: LlamaConfig, state: dict[str, torch.Tensor], target, dtype: torch.dtype,
              path: Path, file: Path) -> MtpHead:
    """The MTP head of `state` on `target` (sharing its embeddings; Qwen3-Next also its lm_head)."""
    config_file = path / "config.json"
    for key in ("hidden_size", "vocab_size"):
        if getattr(config, key) != getattr(target.config, key):
            raise ParityInputError(f"{config_file}: head {key} {getattr(config, key)} does not match the "
                                   f"target's {getattr(target.config, key)}")
    raw = config.to_dict()
    layers = num_mtp_layers(layout, raw, state, file)
    head_config = paged_config(LlamaConfig.from_dict({**raw, "num_hidden_layers": layers}))
    with torch.device("meta"):
        head = MtpHead(head_config, layout)
    names = published_names(head, config.num_hidden_layers)
    shapes = dict(head.state_dict())
    check_keys(state, {names[k]: v.shape for k, v in shapes.items()}, file)
    internal = {v: k for k, v in names.items()}
    assign_weights(head, {internal[k]: v for k, v in state.items()}, dtype)
    head.rotary_emb = LlamaRotaryEmbedding(head_config)
    return head.share(target.embed_tokens, target.lm_head).eval()
