"""The committed tiny pair: checksums, loading, tokenizer, and its recorded acceptance."""

from __future__ import annotations

import json

import pytest
import torch

from parity.models import loader
from parity.models.assets import ASSETS_ROOT, tiny_pair_dir, verify_manifest, write_manifest

PAIR = tiny_pair_dir()


def test_manifest_matches_committed_files():
    assert verify_manifest(ASSETS_ROOT) == []
    manifest = json.loads((ASSETS_ROOT / "MANIFEST.json").read_text())
    assert {"tiny-llama3-eagle/target/model.safetensors", "tiny-llama3-eagle/eagle/model.safetensors",
            "tiny-llama3-eagle/target/tokenizer.json", "tiny-llama3-eagle/build_info.json"} <= set(manifest)
    assert sum(entry["size"] for entry in manifest.values()) < 10 * 1024 * 1024


def test_verify_manifest_reports_tampering(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"weights")
    write_manifest(tmp_path)
    assert verify_manifest(tmp_path) == []
    (tmp_path / "a" / "w.bin").write_bytes(b"weightz")
    (tmp_path / "extra.txt").write_text("x")
    problems = verify_manifest(tmp_path)
    assert any("a/w.bin" in p and "sha256" in p for p in problems)
    assert any("extra.txt" in p for p in problems)


@pytest.fixture(scope="module")
def pair():
    target = loader.load_target(PAIR / "target")
    head = loader.load_eagle1(PAIR / "eagle", target)
    return target, head


def test_committed_pair_loads(pair):
    target, head = pair
    config = target.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim) == (2, 128, 4, 2, 32)
    assert not config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 500000.0
    assert head.config.num_hidden_layers == 1
    assert head.embed_tokens is target.embed_tokens


def test_tokenizer_round_trips_a_prompt():
    tok = loader.load_tokenizer(PAIR / "target")
    prompts = [json.loads(line) for line in
               (ASSETS_ROOT.parents[1] / "scenarios" / "prompts" / "default.jsonl").read_text().splitlines()]
    assert len(prompts) == 16
    for prompt in prompts:
        ids = tok(prompt["text"])["input_ids"]
        assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == prompt["text"]
    assert len(tok) == json.loads((PAIR / "target" / "config.json").read_text())["vocab_size"]


def test_build_info_acceptance_in_band():
    info = json.loads((PAIR / "build_info.json").read_text())
    rates = info["acceptance"]["acceptance_per_position"]
    assert len(rates) == 3
    assert 0.55 <= rates[0] <= 0.9
    assert rates[0] > rates[1] > rates[2] > 0
    assert info["acceptance"]["distinct_4gram_fraction"] > 0.7


def test_greedy_estimate_reproduces_on_a_few_prompts(pair):
    # The committed pair drafts sensibly here too (not only in the build that wrote it).
    from parity.builders.training.build import estimate_prompts
    from parity.builders.training.tokenizer import build_tokenizer
    from parity.builders.training.train import estimate_acceptance
    target, head = pair
    torch.manual_seed(0)
    rates = estimate_acceptance(target, head, estimate_prompts(build_tokenizer())[:4], k=3, max_new_tokens=24)
    assert 0.3 <= rates[0] <= 1.0 and rates[0] >= rates[1] >= rates[2]
