"""Writing a state dict as Hugging Face does: one model.safetensors, or shards of a few GB and an index.

Shards are planned from the tensors' sizes first (their names say how many
there are: model-00001-of-00004.safetensors), then written one at a time, so
only one shard's worth of tensors is ever copied to the CPU; the index maps
every tensor name to its shard (model.safetensors.index.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

SHARD_BYTES = 4 << 30       # Meta-Llama-3-8B ships 4 shards of ~4-5 GB
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(state: dict[str, torch.Tensor], max_bytes: int = SHARD_BYTES) -> list[list[str]]:
    """Tensor names grouped in order into shards of at most `max_bytes` (a larger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state.items():
        if shards[-1] and size + _nbytes(tensor) > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += _nbytes(tensor)
    return shards


def _on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().to("cpu").contiguous()
    # NOTE: safetensors refuses views into a larger storage (and shared storage): copy those.
    if tensor.untyped_storage().nbytes() != _nbytes(tensor):
        tensor = tensor.clone()
    return tensor


def write_safetensors(state: dict[str, torch.Tensor], out_dir, max_bytes: int = SHARD_BYTES) -> list[Path]:
    """Write `state` into `out_dir` (one file, or shards + index); return the files written."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    shards = plan_shards(state, max_bytes)
    names = ([SINGLE_FILE] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    umask = os.umask(0)
    os.umask(umask)
    written = []
    for file_name, shard in zip(names, shards):
        tensors = {name: _on_cpu(state[name]) for name in shard}
        save_file(tensors, str(out_dir / file_name), metadata={"format": "pt"})
        del tensors
        # NOTE: safetensors creates its files owner-only (0600); give them the umask's mode like any other file.
        os.chmod(out_dir / file_name, 0o666 & ~umask)
        written.append(out_dir / file_name)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(t) for t in state.values())},
                 "weight_map": {name: file_name for file_name, shard in zip(names, shards) for name in shard}}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        written.append(out_dir / INDEX_FILE)
    return written
