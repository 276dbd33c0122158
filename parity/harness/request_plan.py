"""The memory plan of a request: its pair's config files, its scenario and modes, and the device's budget.

`plan.make_plan` computes a plan from config dicts; this module finds them
(a zoo name or local folders; a TP rank plans its own slices), refuses a
max_model_len past the model's context, and sets the budget: `--device-memory`,
the GPU's free memory, or the available RAM.
"""

from __future__ import annotations

import torch

from parity.errors import ParityInputError
from parity.engine.config import EngineConfig
from parity.harness.plan import GIB, MemoryPlan, make_plan
from parity.harness.request import load_request_scenario, resolve_backend, resolve_dtype, resolve_modes
from parity.models import memory
from parity.models import tp
from parity.models.zoo import get_entry, resolve_paths


def device_budget(device: torch.device, device_memory_gib: float | None = None) -> tuple[int | None, str]:
    """(bytes a run may use, where that figure comes from): --device-memory, the GPU's free memory, or RAM."""
    if device_memory_gib is not None:
        return int(device_memory_gib * GIB), f"--device-memory {device_memory_gib:g} GiB"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free, f"the free memory of {device} ({total / GIB:.1f} GiB in all)"
    return memory._available_ram(), "the available RAM"


def plan_pair(target_dir, draft_dir, dtype: torch.dtype, scenario, modes, device: torch.device, model: str = "",
              device_memory_gib: float | None = None, shared_pool: bool = False) -> MemoryPlan | None:
    """The plan for the checkpoints in two folders (their config.json only), with the budget; None when a
    config is missing or malformed (the loader then names the file)."""
    # NOTE: a rank of a TP run plans its own slices (docs/tp.md); the drafter is whole on every rank.
    target, head = tp.rank_config_dict(memory._config(target_dir)), memory._config(draft_dir)
    context = target.get("max_position_embeddings")
    if context and scenario.max_model_len > context:
        # NOTE: past the model's context RoPE has no trained positions, and the paged attention walks a
        # context that long at every step: hours on a CPU. vLLM refuses it the same way.
        raise ParityInputError(f"{scenario.path}: max_model_len {scenario.max_model_len} exceeds the model's "
                               f"context ({context}, max_position_embeddings in {target_dir}/config.json)")
    try:
        plan = make_plan(target, head, dtype, scenario, modes, model, shared_pool)
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    plan.budget, plan.budget_source = device_budget(device, device_memory_gib)
    plan.device = str(device)
    return plan


def kv_cache_tokens(scenario) -> int:
    """The KV slots an engine of this scenario allocates per layer (what the loader's memory check reserves)."""
    cfg = EngineConfig.of(scenario)
    return cfg.num_blocks * cfg.block_size


def plan_request(request, scenario, modes, device: torch.device) -> MemoryPlan | None:
    """The plan of a `parity run` / `bisect` / `gate` request: its pair's configs, dtype, scenario and modes."""
    entry = get_entry(request.model)
    target_dir, draft_dir = resolve_paths(request.model, request.target_path, request.draft_path)
    dtype = resolve_dtype(request.dtype, entry.embedded, device)
    return plan_pair(target_dir, draft_dir, dtype, scenario, modes, device, request.model,
                     getattr(request, "device_memory", None), request.policy.shared_drafter_pool)


def plan_of(request) -> MemoryPlan:
    """`parity run --plan`: the plan of a request, from its scenario and pair configs alone."""
    scenario = load_request_scenario(request.scenario_path, request.seed)
    _, device = resolve_backend(request.backend)
    plan = plan_request(request, scenario, resolve_modes(request.modes, scenario), device)
    if plan is None:
        raise ParityInputError(f"{request.model}: no memory plan: a config.json of the pair is missing or lacks "
                               f"hidden_size / num_attention_heads / vocab_size")
    return plan
