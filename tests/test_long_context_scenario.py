"""scenarios/long-context-8k.yaml is valid: four 4000-7000-token prompts, prefilled in 2048-token chunks at 8192.

Running it takes minutes even on the tiny pair (every attention call walks an
8192-token context on two CPU cores: eager and full over 2 of its requests x 4
tokens took 69 s and passed bit for bit), so this checks what makes it valid:
the file, its prompts (regenerated identically, token counts with the
embedded tokenizer), admission, the chunked schedule, the 8B memory plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from parity.engine.config import EngineConfig
from parity.engine.kv_cache import BlockAllocator
from parity.engine.requests import Request, Scheduler
from parity.engine.spec_decode import check_admissible
from parity.graphs.modes import MODES
from parity.harness.modes import request_specs
from parity.harness.plan import GIB, make_plan
from parity.harness.scenario import load_scenario
from parity.models.loader import load_tokenizer
from parity.models.zoo import ASSETS
from parity.builders.training import long_prompts
from test_memory_plan import EAGLE1_8B, LLAMA3_8B

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "long-context-8k.yaml"


def specs():
    scenario = load_scenario(SCENARIO)
    tokenizer = load_tokenizer(ASSETS / "tiny-llama3-eagle" / "target")
    return scenario, tokenizer, request_specs(scenario, tokenizer, EngineConfig.of(scenario))


def test_settings():
    s = load_scenario(SCENARIO)
    assert (s.max_model_len, s.num_requests, s.max_tokens, s.max_num_batched_tokens, s.block_size,
            s.max_num_seqs) == (8192, 4, 128, 2048, 16, 4)
    assert s.modes == MODES and s.arrivals == (0, 0, 0, 0)


def test_prompts_are_4000_to_7000_known_tokens_and_regenerate_identically():
    scenario, tokenizer, found = specs()
    lengths = [len(spec.prompt) for spec in found]
    assert all(4000 <= n <= 7000 for n in lengths) and len(set(lengths)) == 4, lengths
    assert not any(tokenizer.unk_token_id in spec.prompt for spec in found)
    on_disk = [json.loads(line) for line in Path(scenario.prompts_file).read_text().splitlines()]
    assert on_disk == long_prompts.prompts()


def test_every_request_is_admissible_and_prefilled_in_chunks():
    scenario, _, found = specs()
    cfg = EngineConfig.of(scenario)
    for spec in found:
        check_admissible(spec, cfg)
        assert len(spec.prompt) + scenario.max_tokens + 2 * cfg.num_speculative_tokens + 2 <= cfg.max_model_len
    requests = [Request(s.req_id, list(s.prompt), s.max_tokens, s.arrival_step) for s in found]
    scheduler = Scheduler(requests, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                          BlockAllocator(cfg.num_blocks, cfg.block_size), positions_ahead=2 * 3 + 2,
                          max_model_len=cfg.max_model_len)
    chunks = {r.req_id: 0 for r in requests}
    for step in range(100):
        rows = scheduler.schedule(step)
        assert sum(len(row.query) for row in rows) <= cfg.max_num_batched_tokens
        for row in rows:
            if row.is_prefill:
                chunks[row.request.req_id] += 1
                row.request.num_computed = row.chunk_end
        if all(r.prefilled for r in requests):
            break
    total = sum(len(s.prompt) for s in found)
    # Decodes of finished prefills share later steps, so a step or two more than the bare token count needs.
    assert -(-total // cfg.max_num_batched_tokens) <= step + 1 <= -(-total // cfg.max_num_batched_tokens) + 2
    assert all(n >= 2 for n in chunks.values()), chunks


def test_the_8b_plan_fits_an_80_gb_gpu():
    plan = make_plan(LLAMA3_8B, EAGLE1_8B, torch.bfloat16, load_scenario(SCENARIO), MODES)
    worst = plan.total(plan.worst)
    assert 20 * GIB < worst < 40 * GIB, worst / GIB


def test_readme_lists_it():
    shipped = (ROOT / "README.md").read_text().split("Shipped:")[1].split("\n\n")[0]
    assert "long-context-8k" in shipped and "llama3-eagle-short" in shipped
