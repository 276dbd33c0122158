"""Load a target + draft head pair by zoo name."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from parity.models import loader
from parity.models.zoo import ModelEntry, get_entry, resolve_paths


@dataclass
class ModelPair:
    entry: ModelEntry
    target: torch.nn.Module
    head: torch.nn.Module
    tokenizer: object
    target_dir: Path
    draft_dir: Path

    @property
    def name(self) -> str:
        return self.entry.name

    def checksum(self) -> str:
        """sha256 over the config files of both checkpoints (weights are large; configs name them)."""
        digest = hashlib.sha256()
        for folder in (self.target_dir, self.draft_dir):
            for path in sorted(folder.glob("*.json")):
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
            weights = folder / "model.safetensors"
            if weights.is_file() and weights.stat().st_size < 64 << 20:
                digest.update(weights.read_bytes())
        return digest.hexdigest()[:16]


def load_pair(name: str, *, target_path: str | None = None, draft_path: str | None = None,
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> ModelPair:
    entry = get_entry(name)
    target_dir, draft_dir = resolve_paths(name, target_path, draft_path)
    target = loader.load_target(target_dir, dtype=dtype)
    head = loader.load_eagle1(draft_dir, target, dtype=dtype)
    tokenizer = loader.load_tokenizer(target_dir)
    target.to(device)
    head.to(device)
    return ModelPair(entry, target.eval(), head.eval(), tokenizer, target_dir, draft_dir)
