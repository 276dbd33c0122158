"""What a command asks the harness to run, and how its names resolve to things.

A request carries engine parts and a capture policy, never names of bugs:
commands turn `--inject` names into parts before the harness sees them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from parity.engine.config import MAX_SEED
from parity.engine.parts import EngineParts
from parity.errors import ParityInputError
from parity.graphs.modes import EAGER, MODES
from parity.graphs.policy import CapturePolicy
from parity.harness.scenario import Scenario, load_scenario
from parity.models.pair import load_pair
from parity.models.tp import shard_if_parallel
from parity.models.zoo import get_entry


@dataclass(frozen=True)
class RunRequest:
    model: str
    scenario_path: str
    modes: tuple[str, ...] | None      # None: the scenario's modes
    backend: str
    parts: EngineParts = EngineParts()
    policy: CapturePolicy = CapturePolicy()
    seed: int | None = None
    target_path: str | None = None
    draft_path: str | None = None
    dtype: str = "auto"
    bisect: bool = True
    device_memory: float | None = None     # GiB the memory plan may use (None: what the device has free)
    check_unpadded: bool = False           # also run eager one request at a time (`harness.unpadded`)
    jobs: int | None = None                # runs at once (1: one after another; None: `harness.concurrency`)


def resolve_modes(requested: tuple[str, ...] | None, scenario: Scenario) -> tuple[str, ...]:
    modes = requested or scenario.modes
    for m in modes:
        if m not in MODES:
            raise ParityInputError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    # eager is the reference every other mode is compared with: it always runs, first.
    return (EAGER,) + tuple(m for m in dict.fromkeys(modes) if m != EAGER)


def resolve_backend(backend: str) -> tuple[str, torch.device]:
    if backend == "cuda" and not torch.cuda.is_available():
        raise ParityInputError("--backend cuda: CUDA is not available on this machine (use emulated or auto)")
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "emulated"
    return backend, torch.device("cuda" if backend == "cuda" else "cpu")


def resolve_dtype(dtype: str, embedded: bool, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if embedded or device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_request_scenario(scenario_path: str, seed: int | None) -> Scenario:
    """The scenario file, with the command line's --seed applied."""
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise ParityInputError(f"--seed must be in 0..2**63-1, got {seed}")
    scenario = load_scenario(scenario_path)
    return dataclasses.replace(scenario, seed=seed) if seed is not None else scenario


def load_request_pair(request, device: torch.device, kv_cache_tokens: int | None = None):
    """The model pair a request names, in the dtype it asks for, on `device`.

    `kv_cache_tokens`: the KV slots the scenario's engines allocate, which the
    loader's memory check reserves (its default is a fixed 8192).
    """
    entry = get_entry(request.model)
    extra = {} if kv_cache_tokens is None else {"kv_cache_tokens": kv_cache_tokens}
    pair = load_pair(request.model, target_path=request.target_path, draft_path=request.draft_path,
                     dtype=resolve_dtype(request.dtype, entry.embedded, device), device=device, **extra)
    shard_if_parallel(pair.target)      # a rank of a TP run keeps its slices of the target (docs/tp.md)
    return pair


def checkpoint_paths(pair) -> dict:
    """`target_path` and `draft_path` of a pair given by path, for the summary; None for embedded pairs."""
    if pair.entry.embedded:
        return {"target_path": None, "draft_path": None}
    return {"target_path": str(Path(pair.target_dir).resolve()), "draft_path": str(Path(pair.draft_dir).resolve())}
