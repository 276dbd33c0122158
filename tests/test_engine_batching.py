"""A request's drafts do not depend on the requests batched with it (regression: a
fully accepted draft once shifted every later row's draft inputs by one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.models.pair import load_pair

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny-llama3-eagle")


def _drafts(pair, specs, max_num_seqs):
    config = EngineConfig(num_speculative_tokens=3, max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                          block_size=16, max_model_len=256)
    frame = SpecDecodeEngine(pair.target, pair.head, config).run(specs).drafts
    return {(r.req_id, r.position - r.draft_index, r.draft_index): (r.draft_token, r.draft_logprob)
            for r in frame.itertuples()}


def test_drafts_are_the_same_alone_and_batched(pair):
    texts = [json.loads(line)["text"] for line in (ROOT / "scenarios/prompts/default.jsonl").read_text().splitlines()]
    specs = [RequestSpec(i, tuple(pair.tokenizer.encode(texts[i], add_special_tokens=False)), 24, i % 2)
             for i in range(4)]
    batched = _drafts(pair, specs, 4)
    compared = 0
    for spec in specs:
        alone = _drafts(pair, [spec], 1)
        for key, (token, logprob) in alone.items():
            if key in batched:
                compared += 1
                assert batched[key][0] == token, key
                assert abs(batched[key][1] - logprob) < 1e-4, key
    assert compared > 40


def test_engine_acceptance_matches_the_build_estimate(pair):
    info = json.loads((ROOT / "parity/assets/tiny-llama3-eagle/build_info.json").read_text())["acceptance"]
    texts = [json.loads(line)["text"] for line in (ROOT / "scenarios/prompts/default.jsonl").read_text().splitlines()]
    specs = [RequestSpec(i, tuple(pair.tokenizer.encode(t, add_special_tokens=False)), 48) for i, t in enumerate(texts)]
    config = EngineConfig(num_speculative_tokens=3, max_num_seqs=4, max_num_batched_tokens=256, block_size=16,
                          max_model_len=256)
    drafts = SpecDecodeEngine(pair.target, pair.head, config).run(specs).drafts
    per_draft = drafts.drop_duplicates(["step", "req_id"])
    rate0 = float((per_draft.num_accepted > 0).mean())
    assert abs(rate0 - info["acceptance_per_position"][0]) < 0.1

