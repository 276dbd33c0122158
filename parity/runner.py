"""Scenario -> one engine run per mode, on the same schedule -> records."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from parity.engine.config import EngineConfig
from parity.engine.records import RunResult
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.errors import ParityInputError
from parity.scenario import Scenario


@dataclass
class ModeRun:
    mode: str
    result: RunResult
    backend: str
    capture: dict = field(default_factory=dict)   # graph capture summary (sizes, manifest)


def engine_config(scenario: Scenario, spec_decode: bool = True, faults=frozenset()) -> EngineConfig:
    return EngineConfig(
        num_speculative_tokens=scenario.num_speculative_tokens,
        max_num_seqs=scenario.max_num_seqs,
        max_num_batched_tokens=scenario.max_num_batched_tokens,
        block_size=scenario.block_size,
        max_model_len=scenario.max_model_len,
        temperature=scenario.temperature,
        seed=scenario.seed,
        sliding_window=scenario.sliding_window,
        sliding_window_layers=scenario.sliding_window_layers,
        spec_decode=spec_decode,
        faults=frozenset(faults),
    )


def request_specs(scenario: Scenario, tokenizer, config: EngineConfig) -> list[RequestSpec]:
    """Tokenised requests; prompts cycle when num_requests exceeds the prompt set."""
    specs = []
    for i in range(scenario.num_requests):
        prompt_id, text = scenario.prompts[i % len(scenario.prompts)]
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ParityInputError(f"{scenario.prompts_file}: prompt {prompt_id!r} is empty after tokenisation")
        limit = config.max_model_len - config.num_speculative_tokens - 1
        if len(ids) >= limit:
            raise ParityInputError(
                f"{scenario.prompts_file}: prompt {prompt_id!r} has {len(ids)} tokens; max_model_len "
                f"{config.max_model_len} leaves room for at most {limit - 1} with K={config.num_speculative_tokens}")
        if len(ids) > config.max_num_batched_tokens:
            raise ParityInputError(
                f"{scenario.prompts_file}: prompt {prompt_id!r} has {len(ids)} tokens, more than "
                f"max_num_batched_tokens {config.max_num_batched_tokens}")
        specs.append(RequestSpec(i, tuple(ids), scenario.max_tokens, scenario.arrivals[i]))
    return specs


def run_mode(pair, scenario: Scenario, mode: str, backend: str, device: torch.device,
             faults=(), progress=None) -> ModeRun:
    """Run the scenario once in `mode` on a fresh engine (fresh KV cache and graphs)."""
    from parity.graphs.factory import build_executors

    config = engine_config(scenario, faults=faults)
    specs = request_specs(scenario, pair.tokenizer, config)
    engine = SpecDecodeEngine(pair.target, pair.head, config, device)
    capture = build_executors(engine, mode, backend, scenario)
    result = engine.run(specs, progress=progress)
    return ModeRun(mode, result, backend, capture)
