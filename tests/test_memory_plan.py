"""The memory plan: exact where the engine's allocation is known, and a one-line refusal before any weight is read.

- tiny pair: the plan's KV cache and buffer bytes equal the real tensors'
  nbytes, its weights the parameters' bytes (to an optional fc bias), and its
  graph count what `install_graphs` captures, in every mode;
- an 8B pair given by its config.json files only (no weights exist at all):
  `parity run` over budget exits 2 with one line naming the figures and the
  knob, before the loader is ever called; `--plan` prints the table first;
- the loader's own check reserves the scenario's KV cache, not a fixed figure.
"""

from __future__ import annotations

import re

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import parity.models.pair as pair_module
from parity.cli import main
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import SpecDecodeEngine
from parity.graphs.factory import install_graphs
from parity.graphs.modes import MODES
from parity.harness.plan import GIB, make_plan
from parity.harness.scenario import load_scenario
from parity.models import loader, memory
from parity.models.pair import load_pair
from parity.models.zoo import ASSETS

ROOT = Path(__file__).resolve().parent.parent
TINY = ASSETS / "tiny-llama3-eagle"
# Meta-Llama-3-8B (the `llama3-8b` synthetic shape) and an EAGLE-1 head of its size.
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
EAGLE1_8B = dict(LLAMA3_8B, num_hidden_layers=1)


@pytest.fixture(scope="module")
def tiny():
    return load_pair("tiny-llama3-eagle")


def tiny_plan(scenario, modes=MODES, pair=None):
    target, draft = (pair.target_dir, pair.draft_dir) if pair is not None else (TINY / "target", TINY / "eagle")
    return make_plan(memory._config(target), memory._config(draft), torch.float32, scenario, modes)


@pytest.fixture(scope="module")
def tiny3():
    return load_pair("tiny-llama3-eagle3")


@pytest.mark.parametrize("name", ["default", "long-context", "s001-multistep-draft", "long-context-8k", "eagle-tree",
                                  "s005-sampled-drafts"])
@pytest.mark.parametrize("head", ["eagle1", "eagle3"])
def test_kv_cache_and_buffers_are_exactly_what_the_engine_allocates(tiny, tiny3, name, head):
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    pair = tiny if head == "eagle1" else tiny3
    plan = tiny_plan(scenario, ("eager",), pair).modes["eager"]
    engine = SpecDecodeEngine(pair.target, pair.head, EngineConfig.of(scenario))
    kv = sum(t.nbytes for o in engine.owners() for t in o.kv_cache.tensors())
    buffers = sum(t.nbytes for o in engine.owners() for _, t in o.buffers.items())
    assert (plan.kv_cache, plan.buffers) == (kv, buffers)


def test_weights_are_the_parameters_bytes(tiny, tiny3):
    for pair in (tiny, tiny3):
        unique = {t.data_ptr(): t.nbytes for m in (pair.target, pair.head) for t in m.parameters()}
        weights = tiny_plan(load_scenario(ROOT / "scenarios/default.yaml"), pair=pair).weights
        h = pair.target.config.hidden_size
        assert weights - sum(unique.values()) in (0, h * 4), "exact, up to the EAGLE-1 fc bias the count allows"


def test_graph_count_is_what_capture_makes(tiny):
    scenario = dataclasses.replace(load_scenario(ROOT / "scenarios/default.yaml"), capture_sizes=(1, 4, 16, 64))
    plan = tiny_plan(scenario)
    for mode in MODES:
        engine = SpecDecodeEngine(tiny.target, tiny.head, EngineConfig.of(scenario))
        summary = install_graphs(engine, mode, "emulated", scenario.capture_sizes)
        assert plan.modes[mode].graphs == sum(summary.get("graphs", {}).values()), mode


def test_capture_copies_the_state_once_and_the_plan_counts_that_copy(tiny, monkeypatch):
    """Captures put the KV caches and buffers back after each graph from one copy taken per install: the plan
    counts that copy (instead of the activations, which come later) in every mode that captures."""
    import parity.graphs.factory as factory

    scenario = load_scenario(ROOT / "scenarios/default.yaml")
    copies = []
    real = factory.snapshot_tensors
    monkeypatch.setattr(factory, "snapshot_tensors", lambda state: copies.append(len(state)) or real(state))
    engine = SpecDecodeEngine(tiny.target, tiny.head, EngineConfig.of(scenario))
    state = [t for o in engine.owners() for t in o.state_tensors()]
    summary = install_graphs(engine, "full", "emulated", scenario.capture_sizes)
    assert sum(summary["graphs"].values()) > 1 and copies == [len(state)]
    plan = tiny_plan(scenario)
    for mode, p in plan.modes.items():
        assert p.capture_state == (0 if mode == "eager" else p.kv_cache + p.buffers), mode
        held = p.kv_cache + p.buffers + p.graphs_target + p.graphs_drafter + p.pieces
        assert p.run_bytes == held + max(p.activations, p.capture_state) + p.slack


def test_8b_figures_from_configs():
    assert memory.target_params(LLAMA3_8B) == 8_030_261_248      # Meta-Llama-3-8B's published count
    plan = make_plan(LLAMA3_8B, EAGLE1_8B, torch.bfloat16, load_scenario(ROOT / "scenarios/long-context-8k.yaml"),
                     MODES)
    eager = plan.modes["eager"]
    assert eager.kv_cache == 33 * 2 * (4 * 512 * 16 + 1) * 8 * 128 * 2      # 33 layers, 4 x 8192 slots + trash
    assert eager.activations >= 2 * 2048 * 128256 * 4                     # logits and their log-softmax, fp32
    assert plan.modes["piecewise"].pieces > 0 == plan.modes["full"].pieces
    assert 15 * GIB < plan.weights < 16 * GIB


def test_a_padded_reference_is_planned_as_eager_plus_its_padding_probe():
    # H100, 8B EAGLE-3 pair, long-context-8k (2026-11-27): ref:piecewise and ref:full peaked 3.08 GiB above eager
    # (9.65 against 6.57 beyond the weights), while the plan gave them eager's run; ref:full_decode_only did not.
    plan = make_plan(LLAMA3_8B, EAGLE1_8B, torch.bfloat16, load_scenario(ROOT / "scenarios/long-context-8k.yaml"),
                     MODES)
    kv_row = 2 * 32 * 8 * 128 * 2
    outputs = 2048 * (128256 * 4 + 4096 * 2 + kv_row)           # logits fp32, features, the written KV rows
    probe = plan.modes["piecewise"].probe
    assert probe == plan.modes["eager"].buffers + 2048 * kv_row + 2 * outputs and 2.5 * GIB < probe < 3 * GIB
    assert plan.reference_run("full") == plan.modes["eager"].run_bytes + plan.modes["full"].probe
    assert plan.modes["full_decode_only"].probe < 0.1 * GIB     # it pads decode batches only
    assert plan.reference_run("eager") == 0 and plan.as_dict()["modes"]["eager"]["reference_total_bytes"] is None
    plan.budget, plan.budget_source = plan.weights + plan.reference_run("piecewise") - 1, "test"
    plan.modes = {m: p for m, p in plan.modes.items() if m in ("eager", "piecewise")}
    plan.modes["piecewise"].probe += plan.modes["piecewise"].run_bytes        # the reference needs the most
    assert not plan.fits and "the padded reference of piecewise" in plan.message()


def _pair_folder(tmp_path: Path) -> tuple[Path, Path]:
    target, draft = tmp_path / "target", tmp_path / "eagle1"
    for folder, config in ((target, LLAMA3_8B), (draft, EAGLE1_8B)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    return target, draft


def _big_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "big.yaml"
    path.write_text(f"name: big\nprompts: {ROOT / 'scenarios/prompts/long.jsonl'}\nnum_requests: 4\n"
                    "max_num_seqs: 4\nmax_tokens: 128\nmax_model_len: 8192\nmax_num_batched_tokens: 16384\n")
    return path


def _never_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the memory plan was checked")
    for name in ("load_target", "read_head", "build_head", "load_tokenizer"):
        monkeypatch.setattr(loader, name, refuse)


def test_over_budget_8b_exits_2_in_one_line_before_loading(tmp_path, monkeypatch, capsys):
    target, draft = _pair_folder(tmp_path)
    _never_load(monkeypatch)
    out = tmp_path / "run"
    code = main(["run", "--model", "local", "--target-path", str(target), "--draft-path", str(draft),
                 "--dtype", "bfloat16", "--scenario", str(_big_scenario(tmp_path)), "--device-memory", "40",
                 "--quiet", "--out", str(out)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith("parity: error: memory plan: the piecewise run of local in bfloat16 needs")
    assert "weights 15.4" in line and "--device-memory 40 GiB is 40.0 GiB" in line
    assert re.search(r"buffers 0\.\d\d,", line), line       # under 1 GiB: two decimals, never a bare 0.0
    assert "lower max_num_batched_tokens (16384) or capture_sizes (largest 16384)" in line
    assert "leave out --modes" in line and not out.exists() and captured.out == ""


def test_plan_prints_the_table_and_exits_2_when_it_does_not_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "120")
    target, draft = _pair_folder(tmp_path)
    _never_load(monkeypatch)
    args = ["run", "--plan", "--model", "local", "--target-path", str(target), "--draft-path", str(draft),
            "--dtype", "bfloat16", "--scenario", str(_big_scenario(tmp_path))]
    assert main(args + ["--device-memory", "40"]) == 2
    captured = capsys.readouterr()
    assert "memory plan · local · bfloat16" in captured.out and "DOES NOT FIT" in captured.out
    assert len(captured.err.strip().splitlines()) == 1
    assert main(args + ["--device-memory", "80", "--modes", "full"]) == 0
    captured = capsys.readouterr()
    assert "fits" in captured.out and "15.43" in captured.out and captured.err == ""


def test_plan_of_the_tiny_pair(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["run", "--plan", "--modes", "eager,full"]) == 0
    out = capsys.readouterr().out
    for word in ("memory plan · tiny-llama3-eagle · float32", "MiB", "eager", "full", "KV cache", "total"):
        assert word in out


def test_the_loader_reserves_the_scenarios_kv_cache(monkeypatch, tmp_path):
    seen = []
    real = pair_module.check_memory
    monkeypatch.setattr(pair_module, "check_memory", lambda *a, **k: seen.append(a[5]) or real(*a, **k))
    assert main(["run", "--modes", "eager", "--quiet", "--no-bisect", "--out", str(tmp_path / "r")]) == 0
    assert seen == [4 * 16 * 16]      # max_num_seqs x blocks_per_seq x block_size of scenarios/default.yaml


def test_capture_sizes_all_above_the_token_budget(tmp_path):
    """No token-keyed graph at all (found by make fuzz): the plan still sizes every mode."""
    scenario = dataclasses.replace(load_scenario(ROOT / "scenarios/default.yaml"), capture_sizes=(256,))
    plan = tiny_plan(scenario)
    assert plan.knobs["largest_capture_size"] == 0 and plan.modes["piecewise"].graphs == 0
    assert plan.modes["full"].graphs > 0, "uniform decode graphs are keyed by requests, not by these sizes"
