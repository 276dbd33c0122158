"""`parity models synth --head mtp-deepseek|mtp-qwen3next`: tiny MTP pairs in the published layouts whose later
draft positions are accepted like a chain head's (a multi-layer head's later layers do not collapse)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from conftest import accepted_per_position
from parity.cli import main
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.models.pair import load_pair
from tests.mtp_pairs import synth_pair

PROMPTS = Path(__file__).resolve().parent.parent / "scenarios" / "prompts" / "default.jsonl"
HEADS = ["mtp-deepseek --mtp-layers 3", "mtp-qwen3next"]
K = 3


@pytest.fixture(scope="module", params=HEADS)
def built(request):
    return request.param, *synth_pair(request.param)


def test_written_in_the_published_layout(built):
    head, _, draft = built
    with safe_open(str(draft / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    config = json.loads((draft / "config.json").read_text())
    if head.startswith("mtp-deepseek"):
        assert config["num_nextn_predict_layers"] == 3 and config["num_hidden_layers"] == 2
        assert {f"model.layers.{2 + i}.{name}.weight" for i in range(3)
                for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head")} <= keys
        assert all(k.startswith(("model.layers.2.", "model.layers.3.", "model.layers.4.")) for k in keys)
    else:
        assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= keys
        assert all(k.startswith("mtp.") for k in keys)


def test_later_positions_do_not_collapse(built):
    _, target, draft = built
    pair = load_pair("local", target_path=str(target), draft_path=str(draft))
    lines = [json.loads(line)["text"] for line in PROMPTS.read_text().splitlines() if line.strip()][:6]
    specs = [RequestSpec(i, tuple(pair.tokenizer.encode(text, add_special_tokens=False)), 24)
             for i, text in enumerate(lines)]
    config = EngineConfig(num_speculative_tokens=K, max_num_seqs=1, max_num_batched_tokens=64, block_size=16,
                          max_model_len=128)
    result = SpecDecodeEngine(pair.target, pair.head, config).run(specs)
    drafts = result.drafts.groupby(["step", "req_id"]).ngroups
    rates = [c / drafts for c in accepted_per_position(result, K)]
    print(f"{built[0]} acceptance per position at K={K}: {[round(r, 3) for r in rates]}")
    assert rates[0] >= 0.7 and rates == sorted(rates, reverse=True) and rates[-1] >= 0.5 * rates[0], rates


def test_mtp_layers_only_for_mtp_heads(tmp_path, capsys):
    code = main(["models", "synth", "--shape", "tiny", "--head", "eagle1", "--mtp-layers", "2",
                 "--out", str(tmp_path / "x")])
    assert code == 2 and "--mtp-layers is for the MTP heads" in capsys.readouterr().err
