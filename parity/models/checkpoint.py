"""Reading Hugging Face checkpoint folders: config.json and weights (single, sharded, or .bin).

Every problem is a `ParityInputError` of one line that names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from parity.errors import ParityInputError

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


def read_config(path: Path, model_types: tuple[str | None, ...] | None = None) -> LlamaConfig:
    """The LlamaConfig in `path/config.json`; `model_types` lists accepted `model_type` values."""
    file = path / "config.json"
    if not file.is_file():
        raise ParityInputError(f"{file}: missing (expected a Hugging Face config.json)")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParityInputError(f"{file}: not valid JSON ({one_line(exc)})") from None
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
        raise ParityInputError(f"{file}: invalid LlamaConfig ({one_line(exc)})") from None


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
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
    module.load_state_dict(state, strict=True, assign=True)


def expected_keys(module: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Size]:
    # NOTE: rotary buffers are non-persistent, so state_dict() holds exactly the loadable weights.
    return {k: v.shape for k, v in module.state_dict().items() if not k.startswith(skip)}
