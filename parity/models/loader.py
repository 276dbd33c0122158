"""Loading models in Hugging Face layouts: the tiny pair and real checkpoints alike.

Targets are `LlamaForCausalLM` checkpoints (config.json plus model.safetensors,
a sharded safetensors index, or pytorch_model.bin). Draft heads come in the
published layouts, told apart by their keys (`load_head`):
- EAGLE-1 (yuhuili/EAGLE-LLaMA3-Instruct-8B): `fc.weight` [h, 2h] (+ `fc.bias`),
  `layers.0.*` without an input layernorm; embeddings and lm_head are the target's.
- EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): `midlayer.*` (q/k/v over 2h),
  `fc.weight` [h, 3h], `norm.weight`, `lm_head.weight` [draft_vocab, h], `d2t`,
  `t2d`; config.json with `draft_vocab_size` (and optionally
  `eagle_aux_hidden_state_layer_ids`, `target_hidden_size`).
- MTP (DeepSeek-V3/GLM `model.layers.<N+i>.eh_proj`..., Qwen3-Next `mtp.*`): see mtp_loader.py.
Models are built on the meta device and the checked tensors assigned in, so an
8B target costs no random initialisation. Every problem is a `ParityInputError`
of one line that names the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.errors import ParityInputError
from parity.files import read_text_file
from parity.models.checkpoint import (IGNORED_SUFFIXES, assign_weights, check_keys, checkpoint_dir, expected_keys, one_line,
                                      read_config, read_config_json, read_weights)
from parity.models.eagle1 import Eagle1Head
from parity.models.eagle3 import INTERNAL_NAMES, Eagle3Head, aux_layer_ids, draft_vocab_size
from parity.models.llama import TargetModel, paged_config
from parity.models.recurrent import hybridize
from parity.models.mtp_loader import build_mtp, drop_mtp_tensors, mtp_layout, select_mtp_tensors

TOKENIZER_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "clean_up_tokenization_spaces",
                   "model_max_length", "chat_template")


def load_target(path, dtype: torch.dtype = torch.float32, aux_layers: tuple[int, ...] = ()) -> TargetModel:
    """A `TargetModel` (paged attention, eval mode) from a LlamaForCausalLM checkpoint directory."""
    path = checkpoint_dir(path)
    config = read_config(path, model_types=("llama",))
    _check_aux_layers(aux_layers, config.num_hidden_layers, path / "config.json")
    state, file = read_weights(path)
    state = drop_mtp_tensors({k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}, config)
    tied = bool(config.tie_word_embeddings)
    if tied:
        # NOTE: transformers ignores a stored lm_head when embeddings are tied; so do we.
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaForCausalLM(paged_config(config))
        hybridize(model)
    check_keys(state, expected_keys(model, ("lm_head.",) if tied else ()), file)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    assign_weights(model, state, dtype)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Non-persistent buffers (RoPE inverse frequencies) are still on meta: compute them.
    model.model.rotary_emb = LlamaRotaryEmbedding(config)
    return TargetModel(model.eval(), aux_layers)


def _check_aux_layers(aux_layers, num_layers: int, file: Path) -> None:
    # Id i: the hidden state entering layer i; id N: the last layer's output (pre-norm).
    bad = [i for i in aux_layers if not 0 <= i <= num_layers]
    if bad:
        raise ParityInputError(f"{file}: aux layers {bad} out of range for a target of {num_layers} layers "
                               f"(ids 0..{num_layers})")


@dataclass
class HeadCheckpoint:
    """A draft head's config and tensors, read once, with the layout they are in."""

    kind: str                          # "eagle1", "eagle3", "mtp-deepseek" or "mtp-qwen3next"
    path: Path
    file: Path                         # the weights file (or shard index) the tensors came from
    config: LlamaConfig
    state: dict[str, torch.Tensor]


EAGLE3_MARKERS = ("midlayer.", "d2t", "t2d")


def _head_kind(raw_config: dict, state: dict[str, torch.Tensor], file: Path) -> str:
    archs = " ".join(str(a) for a in raw_config.get("architectures") or [])
    if any(k.startswith(EAGLE3_MARKERS) for k in state) or "layers.0.hidden_norm.weight" in state \
            or "Eagle3" in archs or "draft_vocab_size" in raw_config:
        return "eagle3"
    if "fc.weight" in state or any(k.startswith("layers.0.") for k in state):
        return "eagle1"
    raise ParityInputError(f"{file}: not an EAGLE head checkpoint: expected the EAGLE-1 layout (fc.weight, "
                           f"layers.0.*) or the EAGLE-3 layout (midlayer.*, fc.weight, norm.weight, "
                           f"lm_head.weight, d2t, t2d)")


def read_head(path) -> HeadCheckpoint:
    """Read a draft head's config.json and weights and tell its layout from them."""
    path = checkpoint_dir(path)
    config = read_config(path)
    raw = read_config_json(path / "config.json")
    state, file = read_weights(path)
    state = {k: v for k, v in state.items() if not k.endswith(IGNORED_SUFFIXES)}
    layout = mtp_layout(state)
    if layout is not None:
        return HeadCheckpoint(layout, path, file, config, select_mtp_tensors(layout, raw, state, file))
    kind = _head_kind(raw, state, file)
    if kind == "eagle3" and "layers.0.hidden_norm.weight" in state:
        # Some converters write the EAGLE-3 layer as layers.0.*, as vLLM reads it.
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                 for k, v in state.items()}
    return HeadCheckpoint(kind, path, file, config, state)


def head_aux_layers(ckpt: HeadCheckpoint, target_config: LlamaConfig) -> tuple[int, ...]:
    """The target layers whose hidden states the head reads (empty for EAGLE-1)."""
    if ckpt.kind != "eagle3":
        return ()
    ids = aux_layer_ids(ckpt.config, target_config.num_hidden_layers)
    _check_aux_layers(ids, target_config.num_hidden_layers, ckpt.path / "config.json")
    return ids


def build_head(ckpt: HeadCheckpoint, target: TargetModel, dtype: torch.dtype = torch.float32):
    """The head of `ckpt` on `target`; sets `target.aux_layers` to what the head reads."""
    if ckpt.kind == "eagle3":
        head = _build_eagle3(ckpt, target, dtype)
    elif ckpt.kind.startswith("mtp-"):
        head = build_mtp(ckpt.kind, ckpt.config, ckpt.state, target, dtype, ckpt.path, ckpt.file)
    else:
        head = _build_eagle1(ckpt, target, dtype)
    target.aux_layers = head_aux_layers(ckpt, target.config)
    return head


def load_head(path, target: TargetModel, dtype: torch.dtype = torch.float32):
    """An EAGLE-1, EAGLE-3 or MTP head (by the checkpoint's layout) on `target`, in eval mode.

    Sets `target.aux_layers` to the layers the head reads (EAGLE-3) or to none (EAGLE-1, MTP).
    """
    return build_head(read_head(path), target, dtype)


def _expect_kind(ckpt: HeadCheckpoint, kind: str) -> None:
    if ckpt.kind != kind:
        names = {"eagle1": "EAGLE-1", "eagle3": "EAGLE-3"}
        found = names.get(ckpt.kind, ckpt.kind)
        raise ParityInputError(f"{ckpt.file}: an {found} checkpoint where an {names[kind]} "
                               f"head was expected")


def load_eagle1(path, target: TargetModel, dtype: torch.dtype = torch.float32) -> Eagle1Head:
    """An EAGLE-1 head (paged attention, eval mode) sharing `target`'s embeddings and lm_head."""
    ckpt = read_head(path)
    _expect_kind(ckpt, "eagle1")
    return _build_eagle1(ckpt, target, dtype)


def load_eagle3(path, target: TargetModel, dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """An EAGLE-3 head (paged attention, eval mode); sets `target.aux_layers` to the head's ids."""
    ckpt = read_head(path)
    _expect_kind(ckpt, "eagle3")
    return build_head(ckpt, target, dtype)


def _build_eagle1(ckpt: HeadCheckpoint, target: TargetModel, dtype: torch.dtype) -> Eagle1Head:
    path, config, file = ckpt.path, ckpt.config, ckpt.file
    if config.hidden_size != target.config.hidden_size:
        raise ParityInputError(f"{path / 'config.json'}: head hidden_size {config.hidden_size} does not match "
                               f"the target's {target.config.hidden_size}")
    # NOTE: an EAGLE-1 head drafts in the target's vocabulary through the target's own lm_head; a head made
    # for another vocabulary would draft token ids that mean other words (EAGLE-3 heads map theirs with d2t).
    if config.vocab_size != target.config.vocab_size:
        raise ParityInputError(f"{path / 'config.json'}: head vocab_size {config.vocab_size} does not match "
                               f"the target's {target.config.vocab_size} (an EAGLE-1 head drafts in the "
                               f"target's vocabulary)")
    state = dict(ckpt.state)
    # The head shares the target's embeddings; published heads may carry a copy, and some a
    # first-layer input layernorm that EAGLE-1 does not apply.
    for key in ("embed_tokens.weight", "layers.0.input_layernorm.weight"):
        state.pop(key, None)
    with torch.device("meta"):
        head = Eagle1Head(paged_config(config), fc_bias="fc.bias" in state)
    check_keys(state, expected_keys(head), file)
    assign_weights(head, state, dtype)
    head.rotary_emb = LlamaRotaryEmbedding(config)
    return head.share(target.embed_tokens, target.lm_head).eval()


def _check_draft_vocab(state: dict[str, torch.Tensor], draft_vocab: int, vocab: int, file: Path) -> None:
    """d2t/t2d present (unless the draft vocabulary is the target's), consistent, in range."""
    if "d2t" not in state:
        if draft_vocab != vocab:
            raise ParityInputError(f"{file}: missing d2t (needed: draft_vocab_size {draft_vocab} < vocab_size {vocab})")
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)
    d2t = state["d2t"]
    if d2t.dim() != 1 or d2t.shape[0] != draft_vocab:
        raise ParityInputError(f"{file}: d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab},) "
                               f"(one offset per draft token: draft_vocab_size, the rows of lm_head.weight)")
    if d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise ParityInputError(f"{file}: d2t must hold integers, got {d2t.dtype}")
    targets = torch.arange(draft_vocab) + d2t.long()
    if targets.min() < 0 or targets.max() >= vocab or targets.unique().numel() != draft_vocab:
        raise ParityInputError(f"{file}: d2t maps draft ids outside 0..{vocab - 1} or two draft ids to one "
                               f"target id")
    state["d2t"] = d2t.long()
    t2d = state.get("t2d")
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[targets] = True
    if t2d.dim() != 1 or t2d.shape[0] != vocab:
        raise ParityInputError(f"{file}: t2d has shape {tuple(t2d.shape)}, expected ({vocab},) (one flag per "
                               f"target token: vocab_size)")
    t2d = t2d.bool()
    if int(t2d.sum()) != draft_vocab or not bool(t2d[targets].all()):
        raise ParityInputError(f"{file}: t2d does not mark exactly the target ids that d2t maps to")
    state["t2d"] = t2d


def _build_eagle3(ckpt: HeadCheckpoint, target: TargetModel, dtype: torch.dtype) -> Eagle3Head:
    path, config, file = ckpt.path, ckpt.config, ckpt.file
    config_file = path / "config.json"
    tc = target.config
    target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
    if target_hidden != tc.hidden_size:
        raise ParityInputError(f"{config_file}: head target_hidden_size/hidden_size {target_hidden} does not "
                               f"match the target's hidden_size {tc.hidden_size}")
    if config.vocab_size != tc.vocab_size:
        raise ParityInputError(f"{config_file}: head vocab_size {config.vocab_size} does not match the "
                               f"target's {tc.vocab_size}")
    draft_vocab = draft_vocab_size(config)
    if not 0 < draft_vocab <= config.vocab_size:
        raise ParityInputError(f"{config_file}: draft_vocab_size {draft_vocab} must be in 1..{config.vocab_size}")
    head_aux_layers(ckpt, tc)
    state = dict(ckpt.state)
    own_embed = state.pop("embed_tokens.weight", None)
    if own_embed is None and config.hidden_size != tc.hidden_size:
        raise ParityInputError(f"{file}: missing embed_tokens.weight (the head's hidden_size "
                               f"{config.hidden_size} differs from the target's, so it cannot share them)")
    _check_draft_vocab(state, draft_vocab, config.vocab_size, file)
    with torch.device("meta"):
        head = Eagle3Head(paged_config(config), target_hidden_size=target_hidden)
    check_keys(state, {k: v.shape for k, v in head.head_state_dict().items()}, file)
    assign_weights(head, {INTERNAL_NAMES.get(k, k): v for k, v in state.items()}, dtype)
    head.rotary_emb = LlamaRotaryEmbedding(config)
    if own_embed is None:
        return head.share(target.embed_tokens).eval()
    if own_embed.shape != (config.vocab_size, config.hidden_size):
        raise ParityInputError(f"{file}: shape mismatch for embed_tokens.weight: expected "
                               f"{(config.vocab_size, config.hidden_size)}, got {tuple(own_embed.shape)}")
    embed = nn.Embedding(config.vocab_size, config.hidden_size, _weight=own_embed.to(dtype))
    return head.share(embed.requires_grad_(False)).eval()


def load_tokenizer(path) -> PreTrainedTokenizerFast:
    """The fast tokenizer in `path/tokenizer.json`, with special tokens from tokenizer_config.json."""
    path = checkpoint_dir(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ParityInputError(f"{file}: missing (expected a Hugging Face tokenizer.json)")
    kwargs = {}
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        try:
            raw = json.loads(read_text_file(config_file, "tokenizer_config.json"))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ParityInputError(f"{config_file}: not valid JSON ({one_line(exc)})") from None
        if not isinstance(raw, dict):
            raise ParityInputError(f"{config_file}: expected a JSON object")
        for key in TOKENIZER_KEYS:
            value = raw.get(key)
            if isinstance(value, dict):  # serialised AddedToken
                value = value.get("content")
            if value is not None:
                kwargs[key] = value
    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(file), **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ParityInputError(f"{file}: invalid tokenizer ({one_line(exc)})") from None
