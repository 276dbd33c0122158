"""Saving models in the Hugging Face layouts `loader.py` reads: the tiny pairs' build writes them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, PreTrainedTokenizerFast

from parity.models.eagle1 import Eagle1Head
from parity.models.eagle3 import Eagle3Head
from parity.models.llama import TargetModel
from parity.models.loader import TOKENIZER_KEYS


def config_dict(config: LlamaConfig, dtype: torch.dtype) -> dict:
    """config.json's content for `config` with weights in `dtype` (the synthetic pairs write theirs with it)."""
    raw = config.to_diff_dict()
    raw = {k: v for k, v in raw.items() if not k.startswith("_")}
    raw["architectures"] = ["LlamaForCausalLM"]
    rope = raw.get("rope_parameters") or {}
    if "rope_theta" in rope:
        # NOTE: older readers (transformers 4, engines) look for the legacy top-level key.
        raw.setdefault("rope_theta", rope["rope_theta"])
    raw["dtype"] = str(dtype).removeprefix("torch.")
    return raw


def _save_tensors(state: dict[str, torch.Tensor], out_dir: Path) -> None:
    from safetensors.torch import save_file
    seen: set[int] = set()
    tensors = {}
    for key, value in state.items():
        value = value.detach().to("cpu").contiguous()
        # NOTE: safetensors refuses shared storage; clone any tensor whose storage was seen.
        ptr = value.untyped_storage().data_ptr()
        if ptr in seen or value.untyped_storage().nbytes() != value.numel() * value.element_size():
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        tensors[key] = value
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def save_target(target: TargetModel, tokenizer, out_dir) -> None:
    """Write config.json, model.safetensors and (when given) the tokenizer into `out_dir`.

    `tokenizer` is a path to a tokenizer.json (a tokenizer_config.json beside it
    is copied too), a `tokenizers.Tokenizer`, a `PreTrainedTokenizerFast`, or None.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = target.hf
    dtype = next(model.parameters()).dtype
    (out_dir / "config.json").write_text(json.dumps(config_dict(model.config, dtype), indent=2, sort_keys=True) + "\n")
    state = {k: v for k, v in model.state_dict().items() if "rotary_emb" not in k}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    _save_tensors(state, out_dir)
    _save_tokenizer(tokenizer, out_dir)


def _save_tokenizer(tokenizer, out_dir: Path) -> None:
    if tokenizer is None:
        return
    if isinstance(tokenizer, (str, Path)):
        source = Path(tokenizer)
        (out_dir / "tokenizer.json").write_bytes(source.read_bytes())
        config = source.with_name("tokenizer_config.json")
        if config.is_file():
            (out_dir / "tokenizer_config.json").write_bytes(config.read_bytes())
    elif isinstance(tokenizer, PreTrainedTokenizerFast):
        tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
        config = {key: getattr(tokenizer, key, None) for key in TOKENIZER_KEYS}
        config = {k: v for k, v in config.items() if v is not None and not (k == "model_max_length" and v > 1e12)}
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    else:  # a tokenizers.Tokenizer
        tokenizer.save(str(out_dir / "tokenizer.json"))


def save_eagle1(head: Eagle1Head, out_dir) -> None:
    """Write the head's config.json and model.safetensors (published EAGLE-1 layout) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = head.fc.weight.dtype
    (out_dir / "config.json").write_text(json.dumps(config_dict(head.config, dtype), indent=2, sort_keys=True) + "\n")
    _save_tensors(head.head_state_dict(), out_dir)


def save_eagle3(head: Eagle3Head, out_dir) -> None:
    """Write the head's config.json and model.safetensors (published EAGLE-3 layout) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = head.fc.weight.dtype
    raw = config_dict(head.config, dtype)
    raw["architectures"] = ["LlamaForCausalLMEagle3"]
    raw["draft_vocab_size"] = head.lm_head.proj.weight.shape[0]
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    _save_tensors(head.head_state_dict(), out_dir)
