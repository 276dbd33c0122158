"""Load a target + draft head pair by zoo name.

The head's layout (EAGLE-1 or EAGLE-3) is read from its checkpoint first, so
the target is built with the auxiliary layers an EAGLE-3 head reads. Before
any weight is read, `memory.check_memory` compares an estimate with the free
GPU memory (or available RAM) and refuses with one line instead of an OOM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from parity.errors import ParityInputError
from parity.models import loader
from parity.models.checksum import checkpoint_checksum, config_checksum
from parity.models.memory import DEFAULT_KV_TOKENS, check_memory
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
        """16 hex digits telling the loaded checkpoints apart (see parity/models/checksum.py).

        Embedded pairs keep their original checksum, which goldens and baselines pin.
        """
        folders = (self.target_dir, self.draft_dir)
        return config_checksum(folders) if self.entry.embedded else checkpoint_checksum(folders)


# A pair whose target folder holds RECIPE (configs and a tokenizer, no weights) is generated at load on the
# device, each rank its own slices (`parity models synth --at-load`): the generator lives with the builders,
# which the product never imports; the command layer registers it here.
RECIPE = "generate.json"
_GENERATORS: list = []


def register_generator(generate) -> None:
    """`generate(entry, target_dir, draft_dir, dtype, device) -> ModelPair` for folders holding RECIPE."""
    _GENERATORS[:] = [generate]


def load_pair(name: str, *, target_path: str | None = None, draft_path: str | None = None,
              dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
              kv_cache_tokens: int = DEFAULT_KV_TOKENS) -> ModelPair:
    """Target + head (weights cast to `dtype`, moved to `device`) and the target's tokenizer."""
    entry = get_entry(name)
    target_dir, draft_dir = resolve_paths(name, target_path, draft_path)
    if (Path(target_dir) / RECIPE).is_file():
        if not _GENERATORS:
            raise ParityInputError(f"{target_dir}: a pair generated at load (it holds {RECIPE}, no weights); "
                                   "only `parity run` / `parity bisect` generate it")
        return _GENERATORS[0](entry, Path(target_dir), Path(draft_dir), dtype, torch.device(device))
    check_memory(name, target_dir, draft_dir, dtype, device, kv_cache_tokens)
    checkpoint = loader.read_head(draft_dir)
    aux_layers = loader.head_aux_layers(checkpoint, loader.read_config(target_dir, model_types=("llama",)))
    target = loader.load_target(target_dir, dtype=dtype, aux_layers=aux_layers)
    head = loader.build_head(checkpoint, target, dtype=dtype)
    del checkpoint
    tokenizer = loader.load_tokenizer(target_dir)
    target.to(device).requires_grad_(False)
    head.to(device).requires_grad_(False)
    return ModelPair(entry, target.eval(), head.eval(), tokenizer, target_dir, draft_dir)
