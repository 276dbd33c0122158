"""Will a pair fit? A memory estimate checked before any weight is read.

Weights: the parameter count derived from the config files (target, and the
head in its layout) times the size of the requested dtype. KV cache: target
layers plus the head's one layer, for `kv_tokens` tokens. Loading happens on
the CPU (the checkpoint as stored, plus the cast copy when the dtype changes),
then the model moves to the device, so the CPU side needs the files' size (plus
the weights when casting) and the device needs weights + KV cache + a margin
for activations. Either falling short is a one-line `ParityInputError`, not an
out-of-memory crash half way through loading.
"""

from __future__ import annotations

from pathlib import Path

import torch

from parity.errors import ParityInputError
from parity.files import is_file
from parity.models.checkpoint import read_config_json

# Tokens of KV cache the estimate reserves (target + head): e.g. 4 sequences of 2048.
DEFAULT_KV_TOKENS = 8192
GIB = 1 << 30
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _config(path: Path) -> dict:
    """The checkpoint's config.json, sizes checked; {} where there is none (the loader then says so)."""
    file = path / "config.json"
    return read_config_json(file) if is_file(file) else {}


def _layer_params(c: dict, qkv_in: int) -> int:
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    d = c.get("head_dim") or h // heads
    inter = c.get("intermediate_size") or 4 * h
    return qkv_in * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * inter + 2 * h


def target_params(c: dict) -> int:
    h, vocab, layers = c["hidden_size"], c["vocab_size"], c.get("num_hidden_layers", 1)
    embeddings = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return embeddings + layers * _layer_params(c, h) + h


def head_params(c: dict) -> int:
    """EAGLE-3 (a `draft_vocab_size` key): fc 3h->h, qkv over 2h, norm, draft lm_head; else EAGLE-1."""
    h = c["hidden_size"]
    if c.get("num_nextn_predict_layers"):     # MTP: per layer fc 2h->h, three norms, a layer, shared_head.head
        return c["num_nextn_predict_layers"] * (2 * h * h + 3 * h + _layer_params(c, h) + c["vocab_size"] * h)
    if "draft_vocab_size" in c or "Eagle3" in " ".join(map(str, c.get("architectures") or [])):
        target_h = c.get("target_hidden_size") or h
        draft_vocab = c.get("draft_vocab_size") or c["vocab_size"]
        return 3 * target_h * h + _layer_params(c, 2 * h) + h + h + draft_vocab * h
    return 2 * h * h + h + _layer_params(c, h) - h


def kv_bytes_per_token(c: dict, layers: int, dtype: torch.dtype) -> int:
    heads = c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // heads
    return 2 * layers * (c.get("num_key_value_heads") or heads) * d * dtype.itemsize


def _file_bytes(*dirs: Path) -> int:
    return sum(f.stat().st_size for d in dirs for pattern in WEIGHT_GLOBS for f in d.glob(pattern))


def _available_ram() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def estimate(target_dir: Path, draft_dir: Path, dtype: torch.dtype, kv_tokens: int = DEFAULT_KV_TOKENS) -> dict:
    """Bytes: `weights` (in `dtype`), `kv_cache`, `files` (as stored), `cast` (whether loading casts)."""
    tc, hc = _config(Path(target_dir)), _config(Path(draft_dir))
    try:
        weights = (target_params(tc) + head_params(hc)) * dtype.itemsize
        kv = kv_tokens * (kv_bytes_per_token(tc, tc.get("num_hidden_layers", 1), dtype)
                          + kv_bytes_per_token(hc, hc.get("num_nextn_predict_layers") or 1, dtype))
    except (KeyError, TypeError, ZeroDivisionError):
        return {}  # a malformed config: the loader reports it, naming the file
    stored = tc.get("torch_dtype") or tc.get("dtype")
    return {"weights": weights, "kv_cache": kv, "files": _file_bytes(Path(target_dir), Path(draft_dir)),
            "cast": (DTYPE_NAMES.get(stored) if isinstance(stored, str) else None) != dtype}


def check_memory(name: str, target_dir: Path, draft_dir: Path, dtype: torch.dtype, device,
                 kv_tokens: int = DEFAULT_KV_TOKENS) -> dict:
    """Raise a one-line ParityInputError when the pair will not fit; return the estimate."""
    est = estimate(target_dir, draft_dir, dtype, kv_tokens)
    if not est:
        return est
    device = torch.device(device)
    dtype_name = str(dtype).removeprefix("torch.")
    margin = max(GIB // 4, est["weights"] // 20)   # activations, the paged-attention gather, allocator slack
    on_device = est["weights"] + est["kv_cache"] + margin
    load_ram = est["files"] + (est["weights"] if est["cast"] else 0)
    hint = ("a smaller --dtype (bfloat16 or float16)" if dtype == torch.float32 else "a machine with more memory")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if on_device > free:
            raise ParityInputError(
                f"{name}: needs about {on_device / GIB:.1f} GiB of GPU memory ({est['weights'] / GIB:.1f} GiB "
                f"weights in {dtype_name} + {est['kv_cache'] / GIB:.1f} GiB KV cache for {kv_tokens} tokens + "
                f"margin) but {device} has {free / GIB:.1f} GiB free; use {hint}, a larger GPU, or free GPU memory")
        ram_needed = load_ram
    else:
        ram_needed = max(load_ram, est["weights"]) + est["kv_cache"] + margin
    ram = _available_ram()
    if ram is not None and ram_needed > ram:
        raise ParityInputError(
            f"{name}: loading needs about {ram_needed / GIB:.1f} GiB of CPU memory ({est['files'] / GIB:.1f} GiB "
            f"of checkpoint files, {est['weights'] / GIB:.1f} GiB weights in {dtype_name}"
            f"{'' if device.type == 'cuda' else ' + KV cache'}) but {ram / GIB:.1f} GiB is available; use {hint}"
            f"{' or --backend cuda on a GPU machine' if device.type == 'cpu' else ''}, or free memory")
    return est
