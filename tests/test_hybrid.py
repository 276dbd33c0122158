"""A hybrid (recurrent-state) target on the CPU, on a tiny random pair built in-process (no synth, no files).

- speculative decoding stays lossless: the greedy tokens equal those of the target alone, and only because the
  rejected positions' states are rolled back (committing the last draft position instead changes them);
- all five modes run bitwise equal to their padded references, with the padding probe over the state slots clean;
- each hybrid fault of the catalog leaks where the padding contract says (the probe of the strict padded
  reference names the buffer, and the holder of the slot its padded rows name); the full `parity run` path of
  each fault, in every mode, is the mutation matrix's and the GPU tests'.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from tests.conftest import HEAD_FC_EMBED_GAIN, TARGET_BRANCH_SCALE, make_specs, tiny_llama_config
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults import seam
from parity.faults.catalog import FAULTS
from parity.graphs.factory import install_graphs, install_padded_reference
from parity.harness.scenario import load_scenario
from parity.engine.padding_probe import PaddingProbe
from parity.models.eagle1 import Eagle1Head
from parity.models.llama import build_target
from parity.models.paged_attention import ATTN_IMPLEMENTATION
from parity.models.recurrent import RecurrentMixer

pytestmark = pytest.mark.xdist_group("hybrid")
ROOT = Path(__file__).resolve().parent.parent
CONFIG = dict(num_speculative_tokens=3, max_num_seqs=8, max_num_batched_tokens=32, block_size=4, max_model_len=64)
GRAPH_MODES = ("piecewise", "full", "full_decode_only", "full_and_piecewise")
MIXER_GAIN = 0.25   # the mixer's o_proj, relative to the damped attention's
CAPTURE_SIZES = [1, 2, 4, 8, 16]   # FULL: 1, 2 or 4 rows (3 padded to 4); larger batches run eager


def hybrid_pair(seed: int = 0, device: str = "cpu"):
    """conftest's draft-friendly random pair with layer 1 a recurrent mixer (2 heads of 16 dims)."""
    torch.manual_seed(seed)
    cfg = tiny_llama_config()
    cfg.recurrent_layers, cfg.recurrent_heads, cfg.recurrent_head_dim = [1], 2, 16
    target = build_target(cfg)
    head_cfg = LlamaConfig(**{**tiny_llama_config().to_dict(), "num_hidden_layers": 1})
    head_cfg._attn_implementation = ATTN_IMPLEMENTATION
    head = Eagle1Head(head_cfg).share(target.embed_tokens, target.lm_head).eval()
    h = cfg.hidden_size
    with torch.no_grad():
        for layer in target.hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(TARGET_BRANCH_SCALE * (MIXER_GAIN if hasattr(layer.self_attn, "mix") else 1))
            layer.mlp.down_proj.weight.mul_(TARGET_BRANCH_SCALE)
        fc = torch.randn(h, 2 * h) * 0.01
        fc[:, :h] += HEAD_FC_EMBED_GAIN * torch.eye(h)
        head.fc.weight.copy_(fc)
    target.fuse_layers()
    return target.to(device), head.to(device)


@pytest.fixture(scope="module")
def pair():
    return hybrid_pair()


def specs(seed: int = 3, n: int = 5, tokens: int = 10):
    return make_specs(n, seed=seed, max_tokens=tokens, max_prompt=12, stagger=1)


def run(pair, config, specs, mode=None, parts=None, probe=False, backend="emulated", sizes=CAPTURE_SIZES):
    """One engine run: eager, `mode`'s graphs on `backend`, or (`probe`) `mode`'s padded reference probed."""
    device = pair[0].lm_head.weight.device
    engine = SpecDecodeEngine(*pair, config, device, parts=parts or seam.apply(())[0])
    found = None
    if probe:
        found = PaddingProbe(engine.free_blocks, config.block_size, lambda: engine.step)
        install_padded_reference(engine, mode, sizes, probe=found)
    elif mode is not None:
        install_graphs(engine, mode, backend, sizes)
    return engine, engine.run(specs), found


def five_modes_bitwise(pair, backend: str) -> None:
    """Every graph mode replays, equals its probed padded reference bit for bit, and emits eager's tokens."""
    config = EngineConfig(**CONFIG)
    eager = run(pair, config, specs(n=3, tokens=8))[1]
    for mode in GRAPH_MODES:
        engine, graph, _ = run(pair, config, specs(n=3, tokens=8), mode, backend=backend)
        _, reference, probe = run(pair, config, specs(n=3, tokens=8), mode, probe=True)
        assert engine.target.executor.replays > 0, mode
        assert graph.tokens.equals(reference.tokens) and graph.drafts.equals(reference.drafts), mode
        assert graph.outputs == eager.outputs, mode
        assert probe.probed > 0 and probe.leaks == [], (mode, probe.leaks)


def fault_leaks(pair, fault: str, mode: str) -> None:
    """Where the catalog says the fault shows, `mode`'s padded reference leaks through the fault's buffers,
    isolated by an experiment; elsewhere it has no leak."""
    parts, _ = seam.apply((fault,))
    _, _, probe = run(pair, EngineConfig(**CONFIG), specs(tokens=8), mode, parts=parts, probe=True)
    if mode not in FAULTS[fault].manifests_in:
        assert probe.leaks == [], (fault, mode, probe.leaks)
        return
    leak = probe.leaks[0]
    assert leak.owner == "target" and set(FAULTS[fault].buffers) <= set(leak.buffers), (mode, leak)
    assert leak.experiment and leak.evidence
    if "contract" in leak.kinds:
        assert any("held by request" in line for line in leak.evidence), leak.evidence


def test_the_target_has_a_recurrent_layer(pair):
    target, _ = pair
    assert isinstance(target.hf.model.layers[1].self_attn, RecurrentMixer)
    engine = SpecDecodeEngine(*pair, EngineConfig(**CONFIG))
    assert engine.target.state_slots.sentinel == 8 and engine.proposer.buffers is not None
    assert "state_index" in engine.target.buffers and "state_index" not in engine.proposer.buffers


def test_speculation_is_lossless_because_rejected_states_roll_back(pair):
    config = EngineConfig(**CONFIG)
    plain = run(pair, dataclasses.replace(config, spec_decode=False), specs())[1]
    engine, spec, _ = run(pair, config, specs())
    assert spec.outputs == plain.outputs
    assert 0 < spec.drafts.accepted.mean() < 1          # some drafts rejected: rollback had work to do
    slots = engine.target.state_slots
    assert slots.held == {} and slots.free_slots() == list(range(9))   # every slot given back

    kept_all = SpecDecodeEngine(*pair, config)
    commit = kept_all.target.state_slots.commit
    kept_all.target.state_slots.commit = lambda s, p: commit(s, [config.num_speculative_tokens] * len(s))
    assert kept_all.run(specs()).outputs != plain.outputs    # no rollback: rejected tokens stay in the state


def test_every_mode_is_bitwise_equal_to_its_padded_reference(pair):
    five_modes_bitwise(pair, "emulated")


HYBRID_FAULTS = [name for name, fault in FAULTS.items() if fault.scenario == "hybrid"]
@pytest.mark.parametrize("fault", HYBRID_FAULTS)
def test_each_hybrid_fault_breaks_the_state_slot_contract_where_the_catalog_says(pair, fault):
    for mode in GRAPH_MODES:
        fault_leaks(pair, fault, mode)


def test_no_false_alarm_over_ten_seeds_of_the_hybrid_scenario(pair):
    """scenarios/hybrid.yaml's engine settings and schedule shape, ten seeds, each probed in one graph mode."""
    scenario = load_scenario(str(ROOT / "scenarios" / "hybrid.yaml"))
    for seed in range(10):
        config = EngineConfig.of(dataclasses.replace(scenario, seed=seed))
        requests = make_specs(scenario.num_requests, seed=seed, max_tokens=4, max_prompt=12, stagger=1)
        mode = GRAPH_MODES[seed % len(GRAPH_MODES)]
        _, _, probe = run(pair, config, requests, mode, probe=True, sizes=scenario.capture_sizes)
        assert probe.probed > 0 and probe.leaks == [], (seed, mode, probe.leaks)
