"""Reading Hugging Face checkpoint folders: config.json and weights (single, sharded, or .bin).

Every problem is a `ParityInputError` of one line that names the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from parity.errors import ParityInputError
from parity.files import read_text_file, show
from parity.models import speculators
from parity.models.fused_weights import FusedLayers

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")
# Keys some checkpoints carry that are recomputed, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def checkpoint_dir(path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ParityInputError(f"{path}: model directory not found")
    return path


# Sizes a config.json may hold, each a positive integer up to this bound when present (the first three are
# required): a negative, zero, fractional or absurd size is one line and exit 2, not an error deep in torch.
SIZE_KEYS = ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "draft_vocab_size",
             "num_nextn_predict_layers")
MAX_SIZE = 1 << 24
REQUIRED_SIZES = ("hidden_size", "num_attention_heads", "vocab_size")


def read_config_json(file: Path) -> dict:
    """config.json as a dict whose sizes are checked (SIZE_KEYS); every problem is one ParityInputError line."""
    try:
        raw = json.loads(read_text_file(file, "config.json", limit=1 << 20))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParityInputError(f"{file}: not valid JSON ({one_line(exc)})") from None
    if not isinstance(raw, dict):
        raise ParityInputError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    raw = speculators.flatten(raw, file)
    for key in REQUIRED_SIZES:
        if key not in raw:
            raise ParityInputError(f"{file}: missing integer '{key}'")
    for key in SIZE_KEYS:
        value = raw.get(key)
        if value is None and key not in REQUIRED_SIZES:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
            raise ParityInputError(f"{file}: '{key}' must be a positive integer up to {MAX_SIZE}, "
                                   f"got {show(value)}")
    for key in ("dtype", "torch_dtype", "model_type", "hidden_act"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ParityInputError(f"{file}: '{key}' must be a name (a string), got {show(raw[key])}")
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    for key, value in (("rope_theta", raw.get("rope_theta")), ("rms_norm_eps", raw.get("rms_norm_eps")),
                       ("rope_parameters.rope_theta", rope.get("rope_theta"))):
        # NOTE: a zero or negative base or epsilon makes every logit NaN; JSON readers accept NaN and Infinity.
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not math.isfinite(value) or value <= 0):
            raise ParityInputError(f"{file}: '{key}' must be a finite number > 0, got {show(value)}")
    if raw["hidden_size"] % raw["num_attention_heads"] and "head_dim" not in raw:
        raise ParityInputError(f"{file}: hidden_size {raw['hidden_size']} is not a multiple of "
                               f"num_attention_heads {raw['num_attention_heads']} (and no head_dim is given)")
    return raw


def read_config(path: Path, model_types: tuple[str | None, ...] | None = None) -> LlamaConfig:
    """The LlamaConfig in `path/config.json`; `model_types` lists accepted `model_type` values."""
    file = path / "config.json"
    if not file.is_file():
        raise ParityInputError(f"{file}: missing (expected a Hugging Face config.json)")
    raw = read_config_json(file)
    if model_types is not None and raw.get("model_type") not in model_types:
        raise ParityInputError(f"{file}: model_type {raw.get('model_type')!r} is not supported "
                               f"(expected {' or '.join(repr(t) for t in model_types if t)})")
    try:
        config = LlamaConfig.from_dict(raw)
    except Exception as exc:  # noqa: BLE001 - any config error is bad input
        raise ParityInputError(f"{file}: invalid LlamaConfig ({one_line(exc)})") from None
    try:
        # NOTE: a config transformers accepts can still name what it cannot build (an unknown rope_type or
        # hidden_act): one layer and the rotary embedding, built on the meta device, say so before any load.
        with torch.device("meta"):
            LlamaDecoderLayer(config, 0)
            LlamaRotaryEmbedding(config)
    except Exception as exc:  # noqa: BLE001 - whatever the build raises, the config is the cause
        raise ParityInputError(f"{file}: transformers cannot build a Llama layer from it ({one_line(exc)})") \
            from None
    return config


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise ParityInputError(f"{file}: missing")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file
            return load_file(str(file))
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated or corrupt files raise many types
        raise ParityInputError(f"{file}: unreadable or corrupt weights ({one_line(exc)})") from None
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
            raise ParityInputError(f"{file}: invalid shard index ({one_line(exc)})") from None
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(_load_file(path / shard))
        return state, file
    raise ParityInputError(f"{path}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def check_keys(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], file: Path) -> None:
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


def assign_weights(module: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """`state` (floats cast to `dtype`) becomes `module`'s parameters; a head's layers are fused from them."""
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    module.load_state_dict(state, strict=True, assign=True)
    if isinstance(module, FusedLayers):
        module.fuse_layers()


def expected_keys(module: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Size]:
    # NOTE: rotary buffers are non-persistent, so state_dict() holds exactly the loadable weights.
    return {k: v.shape for k, v in module.state_dict().items() if not k.startswith(skip)}
