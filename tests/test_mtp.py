"""MTP heads (DeepSeek-V3/GLM and Qwen3-Next layouts): read and written in the published layouts, the step
index selecting the layer, and every head in all five modes (graphs bitwise equal to eager and to their padded
references) on a tiny random pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from conftest import accepted_per_position, engine_config, make_specs
from parity.engine.spec_decode import SpecDecodeEngine
from parity.errors import ParityInputError
from parity.graphs.factory import install_graphs, install_padded_reference
from parity.models.llama import paged_config
from parity.models.loader import load_head, load_target
from parity.models.mtp import DEEPSEEK, LAYOUTS, QWEN3NEXT, MtpHead

GRAPH_MODES = ["piecewise", "full", "full_decode_only", "full_and_piecewise"]
VOCAB, HIDDEN, TARGET_LAYERS = 97, 64, 2


def target_dict() -> dict:
    return {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128,
            "num_hidden_layers": TARGET_LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "rope_theta": 500000.0}


@pytest.fixture(scope="module")
def target(random_pair):
    """conftest's draft-friendly tiny target (the config of `target_dict`)."""
    target, _ = random_pair
    assert target.config.num_hidden_layers == TARGET_LAYERS and target.config.vocab_size == VOCAB
    return target


def random_head(target, layout: str, layers: int, seed: int = 1) -> MtpHead:
    """An MTP head of `layers` layers with random weights (each layer its own draw) on `target`, draft-friendly
    like the tiny EAGLE-1 pair: fc passes the normed token embedding through, the layer's branches are damped and
    DeepSeek's shared_head.head is near the target's lm_head, so each layer drafts roughly the target's bigram."""
    torch.manual_seed(seed)
    config = paged_config(LlamaConfig(**{**target_dict(), "num_hidden_layers": layers}))
    head = MtpHead(config, layout).share(target.embed_tokens, target.lm_head).eval()
    with torch.no_grad():
        for norm in (*head.enorm, *head.hnorm, *head.final_norm):
            norm.weight.normal_(0.0 if layout == QWEN3NEXT else 1.0, 0.05)
        for fc in head.eh_proj:
            fc.weight.mul_(0.1)[:, :HIDDEN] += torch.eye(HIDDEN)
        for block in head.blocks:
            block.self_attn.o_proj.weight.mul_(0.3)
            block.mlp.down_proj.weight.mul_(0.3)
        for out in head.heads:
            out.weight.mul_(0.01).add_(target.lm_head.weight.cpu())
    return head.requires_grad_(False)


def write(folder: Path, head: MtpHead, extra: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {**target_dict(), "num_nextn_predict_layers": head.num_layers}
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in head.head_state_dict(TARGET_LAYERS).items()}
    save_file({**state, **(extra or {})}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("layers", [1, 3])
def test_published_layout_round_trip(tmp_path, target, layout, layers):
    head = random_head(target, layout, layers)
    state = head.head_state_dict(TARGET_LAYERS)
    if layout == DEEPSEEK:
        assert {f"model.layers.{TARGET_LAYERS + i}.{name}.weight" for i in range(layers)
                for name in ("enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head")} <= set(state)
        assert state[f"model.layers.{TARGET_LAYERS}.eh_proj.weight"].shape == (HIDDEN, 2 * HIDDEN)
    else:
        assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                "mtp.norm.weight"} <= set(state)
        assert {f"mtp.layers.{i}.self_attn.q_proj.weight" for i in range(layers)} <= set(state)
    loaded = load_head(write(tmp_path / "head", head), target)
    assert loaded.layout == layout and loaded.num_layers == layers
    again = loaded.head_state_dict(TARGET_LAYERS)
    assert sorted(again) == sorted(state) and all(torch.equal(again[k], state[k]) for k in state)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_read_from_the_target_checkpoint_itself(tmp_path, target, layout):
    # The published checkpoints keep the MTP tensors beside the target's (DeepSeek also an embed copy).
    head = random_head(target, layout, 2)
    target_state = {k: v.contiguous() for k, v in target.hf.state_dict().items() if "rotary" not in k}
    extra = dict(target_state)
    if layout == DEEPSEEK:
        extra[f"model.layers.{TARGET_LAYERS}.embed_tokens.weight"] = target_state["model.embed_tokens.weight"].clone()
    folder = write(tmp_path / "both", head, extra)
    loaded_target = load_target(folder)
    assert torch.equal(loaded_target.lm_head.weight, target.lm_head.weight)
    loaded = load_head(folder, loaded_target)
    assert loaded.num_layers == 2


def test_layer_count_disagreeing_with_the_tensors_is_one_line(tmp_path, target):
    folder = write(tmp_path / "bad", random_head(target, DEEPSEEK, 2))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 3}))
    with pytest.raises(ParityInputError, match="num_nextn_predict_layers is 3 but the checkpoint's MTP layers"):
        load_head(folder, target)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_step_index_selects_the_layer(target, layout):
    head = random_head(target, layout, 3)
    head.config._attn_implementation = "sdpa"      # one causal sequence, no paged cache
    ids, positions = torch.tensor([5, 7, 11]), torch.tensor([3, 4, 5])
    hidden = torch.randn(3, HIDDEN)
    outputs = []
    for step in range(4):
        bound = head.with_step_index(lambda step=step: torch.tensor([step]))
        outputs.append((bound(ids, positions, hidden), bound.logits(bound(ids, positions, hidden))))
    assert torch.equal(outputs[3][0], outputs[0][0]) and torch.equal(outputs[3][1], outputs[0][1])  # step 3: layer 0
    assert not torch.equal(outputs[1][0], outputs[0][0]) and not torch.equal(outputs[2][0], outputs[1][0])
    with pytest.raises(RuntimeError, match="step index"):
        head(ids, positions, hidden)


@pytest.fixture(scope="module")
def specs():
    return make_specs(3, seed=3, max_tokens=8, max_prompt=12)


HEADS = [(layout, layers) for layout in LAYOUTS for layers in (1, 3)]
_EAGER: dict = {}


def eager_run(target, specs, layout: str, layers: int):
    """The head and its eager run, once per head."""
    if (layout, layers) not in _EAGER:
        head = random_head(target, layout, layers)
        _EAGER[layout, layers] = head, SpecDecodeEngine(target, head, engine_config()).run(specs)
    return _EAGER[layout, layers]


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("layout,layers", HEADS, ids=[f"{h}-{n}" for h, n in HEADS])
def test_every_mode_is_bitwise_its_padded_reference_and_eager(target, specs, layout, layers, mode):
    head, eager = eager_run(target, specs, layout, layers)
    assert accepted_per_position(eager, 3)[0] > 0
    graph = SpecDecodeEngine(target, head, engine_config())
    install_graphs(graph, mode, "emulated")
    reference = SpecDecodeEngine(target, head, engine_config())
    install_padded_reference(reference, mode, poison=True)
    result, padded = graph.run(specs), reference.run(specs)
    # bit for bit its padded reference (logprobs too); eager's tokens and drafts (padding moves logprobs)
    assert result.drafts.equals(padded.drafts) and result.tokens.equals(padded.tokens)
    assert result.outputs == eager.outputs
    tokens = ["step", "req_id", "draft_index", "draft_token", "accepted"]
    assert result.drafts[tokens].equals(eager.drafts[tokens])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_multi_layer_heads_on_cuda_graphs_are_bitwise_their_padded_references(specs, mode):
    from tests.conftest import build_random_pair
    target, _ = build_random_pair()
    target = target.to("cuda")
    for layout in LAYOUTS:
        head = random_head(target, layout, 3).to("cuda")
        graph = SpecDecodeEngine(target, head, engine_config(), device="cuda")
        install_graphs(graph, mode, "cuda")
        reference = SpecDecodeEngine(target, head, engine_config(), device="cuda")
        install_padded_reference(reference, mode, poison=True)
        result, padded = graph.run(specs), reference.run(specs)
        assert result.drafts.equals(padded.drafts) and result.tokens.equals(padded.tokens), (layout, mode)
