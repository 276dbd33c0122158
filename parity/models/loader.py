"""Loading and saving models in Hugging Face layouts: the tiny pair and real checkpoints alike.

Targets are `LlamaForCausalLM` checkpoints (config.json plus model.safetensors,
a sharded safetensors index, or pytorch_model.bin); EAGLE-1 heads use the
published layout (config.json plus fc + one decoder layer). Models are built on
the meta device and the checked tensors assigned in, so an 8B target costs no
random initialisation. Every problem is a `ParityInputError` of one line that
names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from parity.errors import ParityInputError
from parity.models.eagle1 import Eagle1Head
from parity.models.llama import TargetModel, paged_config

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")
# Keys some checkpoints carry that are recomputed, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_TOKENIZER_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "clean_up_tokenization_spaces",
                   "model_max_length", "chat_template")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _directory(path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ParityInputError(f"{path}: model directory not found")
    return path


def read_config(path: Path, model_types: tuple[str | None, ...] | None = None) -> LlamaConfig:
    """The LlamaConfig in `path/config.json`; `model_types` lists accepted `model_type` values."""
    file = path / "config.json"
    if not file.is_file():
        raise ParityInputError(f"{file}: missing (expected a Hugging Face config.json)")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParityInputError(f"{file}: not valid JSON ({_one_line(exc)})") from None
    if not isinstance(raw, dict):
        raise ParityInputError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    for key in ("hidden_size", "num_attention_heads", "vocab_size"):
        if not isinstance(raw.get(key), int):
            raise ParityInputError(f"{file}: missing or invalid integer '{key}'")
    if model_types is not None and raw.get("model_type") not in model_types:
        raise ParityInputError(f"{file}: model_type {raw.get('model_type')!r} is not supported "
                               f"(expected {' or '.join(repr(t) for t in model_types if t)})")
    try:
        return LlamaConfig.from_dict(raw)
    except Exception as exc:  # noqa: BLE001 - any config error is bad input
        raise ParityInputError(f"{file}: invalid LlamaConfig ({_one_line(exc)})") from None


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise ParityInputError(f"{file}: missing")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(file))
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt files raise many types
        raise ParityInputError(f"{file}: unreadable or corrupt weights ({_one_line(exc)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ParityInputError(f"{file}: expected a dict of tensors")
    return state


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of the checkpoint in `path`, and the file (or index) they came from."""
    for name in WEIGHT_FILES:
        file = path / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            return _load_file(file), file
        try:
            weight_map = json.loads(file.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except Exception as exc:  # noqa: BLE001
            raise ParityInputError(f"{file}: invalid shard index ({_one_line(exc)})") from None
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(_load_file(path / shard))
        return state, file
    raise ParityInputError(f"{path}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def _check_keys(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], file: Path) -> None:
    missing = [k for k in expected if k not in state]
    if missing:
        raise ParityInputError(f"{file}: {len(missing)} missing keys (e.g. {', '.join(missing[:3])})")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise ParityInputError(f"{file}: {len(unexpected)} unexpected keys (e.g. {', '.join(unexpected[:3])})")
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise ParityInputError(f"{file}: shape mismatch for {key}: expected {tuple(shape)}, "
                                   f"got {tuple(state[key].shape)}")


def _assign(module: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    module.load_state_dict(state, strict=True, assign=True)


def _expected(module: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Size]:
    # NOTE: rotary buffers are non-persistent, so state_dict() holds exactly the loadable weights.
    return {k: v.shape for k, v in module.state_dict().items() if not k.startswith(skip)}


def load_target(path, dtype: torch.dtype = torch.float32, aux_layers: tuple[int, ...] = ()) -> TargetModel:
    """A `TargetModel` (paged attention, eval mode) from a LlamaForCausalLM checkpoint directory."""
    path = _directory(path)
    config = read_config(path, model_types=("llama",))
    bad_aux = [i for i in aux_layers if not 0 <= i < config.num_hidden_layers]
    if bad_aux:
        raise ParityInputError(f"{path / 'config.json'}: aux layers {bad_aux} out of range for "
                               f"{config.num_hidden_layers} layers")
    state, file = read_weights(path)
    state = {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    tied = bool(config.tie_word_embeddings)
    if tied:
        # NOTE: transformers ignores a stored lm_head when embeddings are tied; so do we.
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaForCausalLM(paged_config(config))
    _check_keys(state, _expected(model, ("lm_head.",) if tied else ()), file)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    _assign(model, state, dtype)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Non-persistent buffers (RoPE inverse frequencies) are still on meta: compute them.
    model.model.rotary_emb = LlamaRotaryEmbedding(config)
    return TargetModel(model.eval(), aux_layers)


def load_eagle1(path, target: TargetModel, dtype: torch.dtype = torch.float32) -> Eagle1Head:
    """An EAGLE-1 head (paged attention, eval mode) sharing `target`'s embeddings and lm_head."""
    path = _directory(path)
    config = read_config(path)
    if config.hidden_size != target.config.hidden_size:
        raise ParityInputError(f"{path / 'config.json'}: head hidden_size {config.hidden_size} does not match "
                               f"the target's {target.config.hidden_size}")
    state, file = read_weights(path)
    # The head shares the target's embeddings; published heads may carry a copy, and some a
    # first-layer input layernorm that EAGLE-1 does not apply.
    for key in ("embed_tokens.weight", "layers.0.input_layernorm.weight"):
        state.pop(key, None)
    state = {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    with torch.device("meta"):
        head = Eagle1Head(paged_config(config), fc_bias="fc.bias" in state)
    _check_keys(state, _expected(head), file)
    _assign(head, state, dtype)
    head.rotary_emb = LlamaRotaryEmbedding(config)
    return head.share(target.embed_tokens, target.lm_head).eval()


def load_tokenizer(path) -> PreTrainedTokenizerFast:
    """The fast tokenizer in `path/tokenizer.json`, with special tokens from tokenizer_config.json."""
    path = _directory(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ParityInputError(f"{file}: missing (expected a Hugging Face tokenizer.json)")
    kwargs = {}
    config_file = path / "tokenizer_config.json"
    if config_file.is_file():
        try:
            raw = json.loads(config_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParityInputError(f"{config_file}: not valid JSON ({_one_line(exc)})") from None
        for key in _TOKENIZER_KEYS:
            value = raw.get(key)
            if isinstance(value, dict):  # serialised AddedToken
                value = value.get("content")
            if value is not None:
                kwargs[key] = value
    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(file), **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ParityInputError(f"{file}: invalid tokenizer ({_one_line(exc)})") from None


def _config_dict(config: LlamaConfig, dtype: torch.dtype) -> dict:
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
    (out_dir / "config.json").write_text(json.dumps(_config_dict(model.config, dtype), indent=2, sort_keys=True) + "\n")
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
        config = {key: getattr(tokenizer, key, None) for key in _TOKENIZER_KEYS}
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
    (out_dir / "config.json").write_text(json.dumps(_config_dict(head.config, dtype), indent=2, sort_keys=True) + "\n")
    _save_tensors(head.head_state_dict(), out_dir)
