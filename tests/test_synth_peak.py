"""The peak of a synthetic pair (parity/builders/synth/peak.py): at Llama-3's 128256-token vocabulary the draft's
top token gets the requested share of its probability, the heads draft the target's bigram distribution at the
same logit scale, the greedy tokens do not move, and tree drafts reach past depth 2.

The fast tests build only what they check at the tiny dims with the real vocabulary; the costly one builds the
whole pair (`parity models synth`) and runs eagle-tree and a chain on it (make test-costly).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from parity.builders.synth import build as synth
from parity.builders.synth.calibrate import START, calibration_tokens
from parity.builders.synth.mtp_weights import mtp_state
from parity.builders.synth.peak import PEAK_TOLERANCE, calibrate_peak, mean_top1, search_peak
from parity.builders.synth.spec import REAL_PEAK, SHAPES, SynthRequest, head_config, target_config
from parity.builders.synth.weights import build_target, eagle1_state, eagle3_state, frequent_ids
from parity.errors import ParityInputError
from parity.models.eagle1 import Eagle1Head

ROOT = Path(__file__).resolve().parent.parent
WIDE = dataclasses.replace(SHAPES["tiny"], name="tiny-128k", vocab_size=128256, draft_vocab_size=32000,
                           peak=REAL_PEAK)


def test_search_peak_brackets_then_bisects_to_the_request():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    scale, peak, trials = search_peak(logits, 0.6, float)
    assert abs(peak - 0.6) <= PEAK_TOLERANCE and (scale, peak) in trials
    assert peak == pytest.approx(mean_top1(logits * scale), abs=1e-6)
    doublings = [s for s, _ in trials if s >= 1 and float(s).is_integer() and (int(s) & (int(s) - 1)) == 0]
    assert doublings[:2] == [1.0, 2.0], trials
    by_scale = sorted(trials)
    assert all(a[1] <= b[1] + 1e-6 for a, b in zip(by_scale, by_scale[1:])), "peak(S) is nondecreasing"
    down = search_peak(logits * 40, 0.6, float)         # already past the request at S = 1: halving brackets it
    assert abs(down[1] - 0.6) <= PEAK_TOLERANCE and down[0] < 1, down
    rounded = search_peak(logits, 0.6, lambda s: float(torch.tensor(s, dtype=torch.bfloat16)))[0]
    assert rounded == float(torch.tensor(rounded, dtype=torch.bfloat16)), "the scale is one the dtype stores"


def test_peak_is_refused_outside_0_1_and_off_for_tiny():
    with pytest.raises(ParityInputError, match="--peak must be in"):
        SynthRequest("tiny", "eagle1", 0.8, "float32", "/tmp/x", peak=1.0)
    assert SynthRequest("tiny", "eagle1", 0.8, "float32", "/tmp/x").draft_peak is None
    assert SynthRequest("llama3-8b", "eagle1", 0.8, "bfloat16", "/tmp/x").draft_peak == REAL_PEAK
    assert SynthRequest("llama3-8b", "eagle1", 0.8, "bfloat16", "/tmp/x", peak=0).draft_peak is None


@pytest.fixture(scope="module")
def wide():
    """The tiny-dims target at the 128k vocabulary, its logit scale calibrated for REAL_PEAK."""
    config = LlamaConfig.from_dict(target_config(WIDE))
    config._attn_implementation = "sdpa"
    frequent = frequent_ids(WIDE, 0)
    target = build_target(WIDE, config, 0, START, frequent, torch.float32, torch.device("cpu"))
    tokens = calibration_tokens(frequent, 0)
    with torch.no_grad():
        flat = target(input_ids=tokens, use_cache=False).logits.float()
    peak = calibrate_peak(target, WIDE, tokens, REAL_PEAK, None)
    return target, frequent, tokens, flat, peak


def test_the_flat_draft_gets_the_requested_peak_and_keeps_its_greedy_tokens(wide):
    target, _, tokens, flat, peak = wide
    assert mean_top1(flat) < 1e-3, "at unit scale the 128k-token bigram is nearly flat (the symptom)"
    assert abs(peak.peak - REAL_PEAK) <= PEAK_TOLERANCE, peak
    assert bool((target.model.norm.weight == peak.scale).all())
    with torch.no_grad():
        sharp = target(input_ids=tokens, use_cache=False).logits.float()
    # S multiplies the final norm's output: in exact arithmetic S x the logits, argmax unchanged
    assert torch.equal(sharp.argmax(-1), flat.argmax(-1))
    assert 0.3 <= mean_top1(sharp) <= 0.9, "the target with its branches on is peaked as real models are"


def _eagle1_logits(target, tokens, state) -> torch.Tensor:
    config = LlamaConfig.from_dict(head_config(WIDE, "eagle1"))
    config._attn_implementation = "sdpa"
    head = Eagle1Head(config)
    head.load_state_dict(state, strict=True)
    head.share(target.model.embed_tokens, target.lm_head)
    hidden = target.model(input_ids=tokens, use_cache=False).last_hidden_state
    positions = torch.arange(tokens.shape[1])
    return torch.cat([head.logits(head(t, positions, h)) for t, h in zip(tokens, hidden)])


@torch.no_grad()
def test_eagle1_drafts_the_bigram_distribution_at_the_targets_scale(wide):
    target, _, tokens, _, peak = wide
    tokens = tokens[:4]      # 256 positions: the head's forward at 128k logits is the cost here
    config = LlamaConfig.from_dict(head_config(WIDE, "eagle1"))
    sharp = _eagle1_logits(target, tokens, eagle1_state(config, WIDE, target, 0, tokens, torch.float32,
                                                        torch.device("cpu"), peak.scale, peak.head_gain))
    assert abs(mean_top1(sharp) - peak.peak) <= 0.05, (mean_top1(sharp), peak)
    scale = target.model.norm.weight.clone()
    target.model.norm.weight.fill_(1.0)
    try:   # the unit recipe's head on the unit target: the same drafts
        unit = _eagle1_logits(target, tokens, eagle1_state(config, WIDE, target, 0, tokens, torch.float32,
                                                           torch.device("cpu")))
    finally:
        target.model.norm.weight.copy_(scale)
    assert mean_top1(unit) < 1e-3
    same = (sharp.argmax(-1) == unit.argmax(-1)).float().mean()
    assert same >= 0.98, f"the scaled head drafts other tokens at {1 - same:.3f} of positions"


@torch.no_grad()
def test_eagle3_and_mtp_heads_share_the_targets_final_scale(wide):
    target, frequent, tokens, _, peak = wide
    cpu = torch.device("cpu")
    state = eagle3_state(LlamaConfig.from_dict(head_config(WIDE, "eagle3")), WIDE, target, frequent, 0,
                         torch.float32, cpu, peak.scale)
    assert bool((state["norm.weight"] == peak.scale).all())
    for layout, final, offset in (("mtp-deepseek", "model.layers.2.shared_head.norm.weight", 0.0),
                                  ("mtp-qwen3next", "mtp.norm.weight", 1.0)):     # zero-centred: 1 + w
        config = LlamaConfig.from_dict(head_config(WIDE, layout))
        state = mtp_state(config, layout, WIDE, target, 0, tokens, torch.float32, cpu, peak.scale)
        assert bool((state[final] + offset == peak.scale).all()), layout


@pytest.mark.costly
def test_a_built_wide_vocab_pair_drafts_trees_past_depth_two(tmp_path, monkeypatch):
    """`parity models synth` at the 128k vocabulary, then eagle-tree (5 steps of topk 4, 15 nodes) in eager: nodes
    reach depth 3 and more, and a chain's first-draft acceptance stays near the calibrated agreement."""
    from conftest import accepted_per_position
    from parity.engine.config import EngineConfig
    from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
    from parity.models.pair import load_pair

    monkeypatch.setitem(SHAPES, WIDE.name, WIDE)
    info = synth.synthesize(SynthRequest(WIDE.name, "eagle1", 0.8, "float32", str(tmp_path / "p"), 0, "cpu"),
                            progress=lambda line: None)
    assert abs(info["peak"]["measured"] - REAL_PEAK) <= PEAK_TOLERANCE and abs(info["agreement"] - 0.8) <= 0.03
    pair = load_pair("local", target_path=str(tmp_path / "p" / "target"), draft_path=str(tmp_path / "p" / "eagle1"))
    lines = [json.loads(x) for x in (ROOT / "scenarios/prompts/default.jsonl").read_text().splitlines() if x.strip()]
    specs = [RequestSpec(i, tuple(pair.tokenizer.encode(item["text"], add_special_tokens=False)), 16, 0)
             for i, item in enumerate(lines[:4])]
    common = dict(max_num_seqs=4, block_size=16, max_model_len=256, max_num_batched_tokens=128)
    tree = SpecDecodeEngine(pair.target, pair.head, EngineConfig(num_speculative_tokens=5, topk=4,
                                                                 num_draft_tokens=15, **common)).run(specs)
    depths = set(tree.drafts.draft_index)
    assert max(depths) >= 2, f"tree nodes only at depths {sorted(d + 1 for d in depths)}"
    chain = SpecDecodeEngine(pair.target, pair.head, EngineConfig(num_speculative_tokens=3, **common)).run(specs)
    first = accepted_per_position(chain, 3)[0] / chain.drafts.groupby(["step", "req_id"]).ngroups
    assert 0.6 <= first <= 0.95, first


@pytest.mark.gpu
def test_the_1b_pair_on_cuda_is_peaked_and_its_trees_get_deep(tmp_path):
    """llama3-1b (the real vocabulary, tied embeddings) built on CUDA in bf16: the calibrated peak holds at the
    scale bf16 stores, and eagle-tree's nodes reach depth 3 (eager only: the build is most of the 30 s)."""
    from parity.cli import main

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "llama3-1b"
    info = synth.synthesize(SynthRequest("llama3-1b", "eagle1", 0.8, "bfloat16", str(out), 0, "cuda"),
                            progress=print)
    assert abs(info["peak"]["measured"] - REAL_PEAK) <= PEAK_TOLERANCE, info["peak"]
    assert info["peak"]["logit_scale"] == float(torch.tensor(info["peak"]["logit_scale"], dtype=torch.bfloat16))
    run = tmp_path / "run"
    code = main(["run", "--model", "local", "--target-path", str(out / "target"), "--draft-path", str(out / "eagle1"),
                 "--dtype", "bfloat16", "--backend", "cuda", "--scenario", str(ROOT / "scenarios" / "eagle-tree.yaml"),
                 "--modes", "eager", "--out", str(run), "--quiet"])
    summary = json.loads((run / "summary.json").read_text())
    assert code == 0 and summary["verdict"] == "pass", summary["modes"]
    import pandas as pd

    drafts = pd.read_parquet(run / "records.parquet")
    assert drafts.draft_index.max() >= 2, sorted(set(drafts.draft_index))
