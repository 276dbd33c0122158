"""The embedded trained pair `tiny-llama3-eagle`: oracle output and a realistic acceptance profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import accepted_per_position, hf_greedy, hf_reference
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine

ROOT = Path(__file__).resolve().parent.parent
TARGET_CONFIG = ROOT / "parity" / "assets" / "tiny-llama3-eagle" / "target" / "config.json"
PROMPTS = ROOT / "scenarios" / "prompts" / "default.jsonl"
NUM_PROMPTS, MAX_TOKENS, K = 8, 32, 3


@pytest.fixture(scope="module")
def pair():
    from parity.models.pair import load_pair
    return load_pair("tiny-llama3-eagle")


@pytest.fixture(scope="module")
def specs(pair):
    lines = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    assert len(lines) >= NUM_PROMPTS, f"{PROMPTS} has fewer than {NUM_PROMPTS} prompts"
    out = []
    for i, item in enumerate(lines[:NUM_PROMPTS]):
        ids = pair.tokenizer.encode(item["text"], add_special_tokens=False)
        assert ids, f"prompt {item.get('id', i)!r} is empty after tokenisation"
        out.append(RequestSpec(i, tuple(ids), MAX_TOKENS, arrival_step=i // 2))
    return out


def config_for(pair, specs, **overrides) -> EngineConfig:
    longest = max(len(s.prompt) for s in specs)
    max_model_len = min(pair.target.config.max_position_embeddings, longest + MAX_TOKENS + 4 * K + 8)
    base = dict(num_speculative_tokens=K, max_num_seqs=4, block_size=16, max_model_len=max_model_len,
                max_num_batched_tokens=max(128, longest + 4 * (K + 1)))
    base.update(overrides)
    return EngineConfig(**base)


@pytest.fixture(scope="module")
def greedy_run(pair, specs):
    return SpecDecodeEngine(pair.target, pair.head, config_for(pair, specs)).run(specs)


def test_eager_greedy_equals_transformers_generate(pair, specs, greedy_run):
    model = hf_reference(pair.target, "eager")
    for s in specs:
        assert greedy_run.outputs[s.req_id] == hf_greedy(model, s.prompt, MAX_TOKENS), f"prompt {s.req_id}"
    plain = SpecDecodeEngine(pair.target, pair.head, config_for(pair, specs, spec_decode=False)).run(specs)
    assert plain.outputs == greedy_run.outputs


def test_acceptance_profile_is_realistic(greedy_run):
    drafts = greedy_run.drafts.groupby(["step", "req_id"]).ngroups
    assert drafts > 0
    rates = [c / drafts for c in accepted_per_position(greedy_run, K)]
    print(f"acceptance per position at K={K}: {[round(r, 3) for r in rates]}")
    assert 0.5 <= rates[0] <= 0.95, f"position-0 acceptance {rates[0]:.3f} outside [0.5, 0.95]"
    assert rates == sorted(rates, reverse=True)
