"""EAGLE-3 heads: the published checkpoint layouts, one-line errors, the aux features, engine parity
in every graph mode, and the embedded pair `tiny-llama3-eagle3` against transformers' generate.

The layout tests write checkpoints with the published key names (yuhuili/EAGLE-LLaMA3-Instruct-8B,
yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) at scaled-down shapes with random values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig

from conftest import accepted_per_position, hf_greedy, hf_reference
from parity.engine.config import EngineConfig
from parity.engine.spec_decode import RequestSpec, SpecDecodeEngine
from parity.errors import ParityInputError
from parity.graphs.factory import install_graphs
from parity.models import loader
from parity.builders.training.train import attention_implementation
from parity.models.eagle1 import Eagle1Head
from parity.models.eagle3 import Eagle3Head
from parity.models.llama import build_target

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "parity" / "assets"
PROMPTS = ROOT / "scenarios" / "prompts" / "default.jsonl"
GRAPH_MODES = ["piecewise", "full", "full_decode_only", "full_and_piecewise"]

# scaled-down Llama-3: the published heads' key names, tiny shapes
H, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, DRAFT_VOCAB, LAYERS = 32, 4, 2, 8, 48, 61, 24, 8


def target_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                       max_position_embeddings=128, rope_theta=500000.0)


def published_config(**extra) -> dict:
    """The fields of the published head configs (Llama-3 8B values scaled down)."""
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "hidden_size": H, "initializer_range": 0.02, "intermediate_size": INTER,
            "max_position_embeddings": 128, "model_type": "llama", "num_attention_heads": HEADS,
            "num_hidden_layers": 1, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "pretraining_tp": 1,
            "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False,
            "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True, "vocab_size": VOCAB,
            **extra}


def _layer(prefix: str, qkv_in: int, gen) -> dict:
    shapes = {"self_attn.q_proj.weight": (HEADS * HEAD_DIM, qkv_in),
              "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, qkv_in),
              "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, qkv_in),
              "self_attn.o_proj.weight": (H, HEADS * HEAD_DIM),
              "mlp.gate_proj.weight": (INTER, H), "mlp.up_proj.weight": (INTER, H), "mlp.down_proj.weight": (H, INTER),
              "post_attention_layernorm.weight": (H,)}
    return {prefix + k: torch.randn(s, generator=gen).half() for k, s in shapes.items()}


def eagle1_state(seed: int = 0, with_embed: bool = False) -> dict:
    gen = torch.Generator().manual_seed(seed)
    state = {"fc.weight": torch.randn(H, 2 * H, generator=gen).half(), "fc.bias": torch.randn(H, generator=gen).half(),
             **_layer("layers.0.", H, gen)}
    if with_embed:
        state["embed_tokens.weight"] = torch.randn(VOCAB, H, generator=gen).half()
    return state


def draft_ids(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 100)
    return torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values


def eagle3_state(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = draft_ids(seed)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    state = {**_layer("midlayer.", 2 * H, gen),
             "midlayer.input_layernorm.weight": torch.randn(H, generator=gen).half(),
             "midlayer.hidden_norm.weight": torch.randn(H, generator=gen).half(),
             "fc.weight": torch.randn(H, 3 * H, generator=gen).half(),
             "norm.weight": torch.randn(H, generator=gen).half(),
             "lm_head.weight": torch.randn(DRAFT_VOCAB, H, generator=gen).half(),
             "d2t": ids - torch.arange(DRAFT_VOCAB), "t2d": t2d}
    return state


def eagle3_config(**extra) -> dict:
    return published_config(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=DRAFT_VOCAB, **extra)


def write_checkpoint(folder: Path, config: dict, state: dict, fmt: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
        return folder / "pytorch_model.bin"
    save_file(state, str(folder / "model.safetensors"))
    return folder / "model.safetensors"


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    return build_target(target_config())


def assert_loaded(head, state: dict, skip=()) -> None:
    loaded = head.head_state_dict()
    expected = {k: v for k, v in state.items() if k not in skip}
    assert sorted(loaded) == sorted(expected)
    for key, value in expected.items():
        want = value.float() if value.is_floating_point() else value
        assert torch.equal(loaded[key], want), key


# --- published layouts ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("with_embed", [False, True])
def test_reads_published_eagle1_layout(tmp_path, target, fmt, with_embed):
    state = eagle1_state(with_embed=with_embed)
    write_checkpoint(tmp_path / "eagle", published_config(), state, fmt)
    target.aux_layers = (1, 2, 3)
    head = loader.load_head(tmp_path / "eagle", target)
    assert isinstance(head, Eagle1Head) and target.aux_layers == ()
    assert head.embed_tokens is target.embed_tokens and head.lm_head is target.lm_head
    assert_loaded(head, state, skip=("embed_tokens.weight",))
    assert loader.load_eagle1(tmp_path / "eagle", target).fc.bias is not None


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_reads_published_eagle3_layout(tmp_path, target, fmt):
    state = eagle3_state()
    write_checkpoint(tmp_path / "eagle3", eagle3_config(), state, fmt)
    head = loader.load_head(tmp_path / "eagle3", target)
    assert isinstance(head, Eagle3Head)
    assert target.aux_layers == (2, LAYERS // 2, LAYERS - 3)     # vLLM's default for Llama
    assert head.embed_tokens is target.embed_tokens
    assert head.fc.weight.shape == (H, 3 * H) and head.midlayer.self_attn.q_proj.in_features == 2 * H
    assert head.lm_head.weight.shape[0] == VOCAB                  # what the engine sizes its buffers by
    assert_loaded(head, state)
    # logits: draft-vocab logits scattered to target ids through d2t, -inf elsewhere
    x = torch.randn(5, H)
    logits = head.logits(x)
    draft = F.linear(head.norm(x), state["lm_head.weight"].float())
    ids = draft_ids()
    assert logits.shape == (5, VOCAB) and logits.dtype == torch.float32
    assert torch.allclose(logits[:, ids], draft, atol=1e-5)
    others = torch.ones(VOCAB, dtype=torch.bool)
    others[ids] = False
    assert torch.isneginf(logits[:, others]).all()
    assert loader.load_eagle3(tmp_path / "eagle3", target, dtype=torch.bfloat16).fc.weight.dtype == torch.bfloat16


def test_eagle3_aux_layer_ids_from_config(tmp_path, target):
    write_checkpoint(tmp_path / "e", eagle3_config(eagle_aux_hidden_state_layer_ids=[0, 4, LAYERS]),
                     eagle3_state(), "safetensors")
    loader.load_head(tmp_path / "e", target)
    assert target.aux_layers == (0, 4, LAYERS)
    # The target's aux features: the hidden states entering layers 0 and 4, and (id N) the
    # last layer's output before the final norm.
    ids = torch.randint(0, VOCAB, (9,))
    with attention_implementation("sdpa", target.config):
        hidden, aux = target(ids, torch.arange(9), None)
        states = target.hf.model(input_ids=ids.unsqueeze(0), output_hidden_states=True).hidden_states
    assert aux.shape == (9, 3 * H)
    assert torch.allclose(aux[:, :H], states[0][0]) and torch.allclose(aux[:, H:2 * H], states[4][0], atol=1e-6)
    assert torch.allclose(target.hf.model.norm(aux[:, 2 * H:]), hidden, atol=1e-6)
    target.aux_layers = ()


def _drop_q_proj(state, config):
    del state["midlayer.self_attn.q_proj.weight"]


def _wrong_fc(state, config):
    state["fc.weight"] = torch.zeros(H, 2 * H).half()


def _short_d2t(state, config):
    state["d2t"] = state["d2t"][:-3]


def _t2d_disagrees(state, config):
    state["t2d"] = state["t2d"].roll(1)


def _aux_out_of_range(state, config):
    config["eagle_aux_hidden_state_layer_ids"] = [0, 4, LAYERS + 1]


@pytest.mark.parametrize("corrupt, names", [
    (_drop_q_proj, ["midlayer.self_attn.q_proj.weight", "missing"]),
    (_wrong_fc, ["fc.weight", f"({H}, {3 * H})", f"({H}, {2 * H})"]),
    (_short_d2t, ["d2t", f"({DRAFT_VOCAB},)", f"({DRAFT_VOCAB - 3},)"]),
    (_t2d_disagrees, ["t2d", "d2t"]),
    (_aux_out_of_range, ["config.json", str(LAYERS + 1)]),
])
def test_rejects_a_broken_eagle3_checkpoint_in_one_line(tmp_path, target, corrupt, names):
    state, config = eagle3_state(), eagle3_config()
    corrupt(state, config)
    weights = write_checkpoint(tmp_path / "bad", config, state, "bin")
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_head(tmp_path / "bad", target)
    message = str(excinfo.value)
    assert "\n" not in message
    assert str(weights) in message or str(tmp_path / "bad" / "config.json") in message, message
    for name in names:
        assert name in message, message


def test_rejects_a_checkpoint_in_neither_layout(tmp_path, target):
    write_checkpoint(tmp_path / "x", published_config(), {"model.norm.weight": torch.ones(H)}, "safetensors")
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_head(tmp_path / "x", target)
    message = str(excinfo.value)
    assert "\n" not in message and "model.safetensors" in message and "midlayer" in message
    with pytest.raises(ParityInputError, match="EAGLE-3 checkpoint where an EAGLE-1"):
        write_checkpoint(tmp_path / "e3", eagle3_config(), eagle3_state(), "safetensors")
        loader.load_eagle1(tmp_path / "e3", target)


# --- the embedded pair tiny-llama3-eagle3, in the engine ----------------------------------------

NUM_PROMPTS, MAX_TOKENS, K = 8, 24, 3


@pytest.fixture(scope="module")
def pair():
    from parity.models.pair import load_pair
    return load_pair("tiny-llama3-eagle3")


@pytest.fixture(scope="module")
def specs(pair):
    lines = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [RequestSpec(i, tuple(pair.tokenizer.encode(item["text"], add_special_tokens=False)), MAX_TOKENS,
                        arrival_step=i // 2) for i, item in enumerate(lines[:NUM_PROMPTS])]


def config_for(specs, **overrides) -> EngineConfig:
    longest = max(len(s.prompt) for s in specs)
    base = dict(num_speculative_tokens=K, max_num_seqs=4, block_size=16,
                max_model_len=longest + MAX_TOKENS + 4 * K + 8, max_num_batched_tokens=max(64, longest + 4 * (K + 1)))
    base.update(overrides)
    return EngineConfig(**base)


@pytest.fixture(scope="module")
def eager(pair, specs):
    return SpecDecodeEngine(pair.target, pair.head, config_for(specs)).run(specs)


def test_tiny_eagle3_eager_greedy_equals_transformers_generate(pair, specs, eager):
    model = hf_reference(pair.target, "eager")
    for s in specs:
        assert eager.outputs[s.req_id] == hf_greedy(model, s.prompt, MAX_TOKENS), f"prompt {s.req_id}"


def test_tiny_eagle3_acceptance_profile(pair, specs):
    # One sequence at a time: a request's acceptance must not depend on its batch.
    solo = SpecDecodeEngine(pair.target, pair.head, config_for(specs, max_num_seqs=1)).run(specs)
    drafts = solo.drafts.groupby(["step", "req_id"]).ngroups
    rates = [c / drafts for c in accepted_per_position(solo, K)]
    print(f"tiny-llama3-eagle3 acceptance per position at K={K}: {[round(r, 3) for r in rates]}")
    assert 0.55 <= rates[0] <= 0.9 and rates == sorted(rates, reverse=True) and rates[-1] > 0


def test_drafts_do_not_depend_on_the_batch(pair, specs, eager):
    # Regression: the drafter's shifted inputs after a fully accepted draft were K+2 long,
    # moving every later row of the batch one slot off (fixed in SpecDecodeEngine._draft).
    solo = SpecDecodeEngine(pair.target, pair.head, config_for(specs, max_num_seqs=1)).run(specs)
    columns = ["req_id", "position", "draft_index", "draft_token"]
    order = ["req_id", "position", "draft_index"]
    assert solo.outputs == eager.outputs
    assert eager.drafts.sort_values(order)[columns].reset_index(drop=True).equals(
        solo.drafts.sort_values(order)[columns].reset_index(drop=True))


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_tiny_eagle3_graph_modes_match_eager(pair, specs, eager, mode):
    engine = SpecDecodeEngine(pair.target, pair.head, config_for(specs))
    summary = install_graphs(engine, mode, "emulated")
    assert sum(summary["graphs"].values()) > 0
    result = engine.run(specs)
    assert result.outputs == eager.outputs, mode
    assert accepted_per_position(result, K) == accepted_per_position(eager, K)
    columns = ["step", "req_id", "draft_index", "draft_token", "accepted"]
    order = ["step", "req_id", "draft_index"]
    assert result.drafts.sort_values(order)[columns].reset_index(drop=True).equals(
        eager.drafts.sort_values(order)[columns].reset_index(drop=True))


def test_tiny_eagle3_assets_reuse_the_tiny_target(pair):
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (ASSETS / "tiny-llama3-eagle3" / "target" / name).read_bytes() == \
            (ASSETS / "tiny-llama3-eagle" / "target" / name).read_bytes(), name
    config = json.loads((ASSETS / "tiny-llama3-eagle3" / "eagle3" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and config["draft_vocab_size"] == 256
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (pair.head.lm_head.d2t >= 0).all() and int(pair.head.lm_head.t2d.sum()) == 256


def test_drafting_over_the_draft_vocabulary_is_drafting_over_the_target_vocabulary(pair):
    # The proposer reduces over the head's 256 draft ids (`own_logits`) and maps what it draws to the target's
    # ids: the same tokens, logits and distributions as working over the target vocabulary with -inf elsewhere.
    head, gen = pair.head, torch.Generator().manual_seed(0)
    hidden = torch.randn(6, head.config.hidden_size, generator=gen)
    own, full = head.own_logits(hidden), head.logits(hidden)
    assert own.shape[-1] == 256 and full.shape[-1] == pair.head.lm_head.target_vocab_size > 256
    assert torch.equal(head.vocab.logits_to_target(own), full)
    assert torch.equal(head.vocab.to_target(own.argmax(-1)), full.argmax(-1))
    probs = head.vocab.distribution_to_target(torch.softmax(own / 0.7, dim=-1))
    assert torch.equal(probs == 0, ~head.lm_head.t2d.expand_as(probs))
    # the same values up to fp32 summation order (the -inf terms add exact zeros in another order)
    torch.testing.assert_close(probs, torch.softmax(full / 0.7, dim=-1), rtol=0, atol=1e-7)


def test_sampled_draft_probs_live_on_the_draft_vocabulary(pair, specs):
    engine = SpecDecodeEngine(pair.target, pair.head, config_for(specs[:2], temperature=0.8, seed=3))
    result = engine.run(specs[:2])
    probs = engine.owner("drafter").buffers["draft_probs"][:2]        # the last step's distributions
    t2d = pair.head.lm_head.t2d
    assert len(result.drafts) > 0 and (probs[..., ~t2d] == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]), rtol=0, atol=1e-5)
    drafted = torch.tensor(result.drafts["draft_token"].tolist())
    assert t2d[drafted].all(), "every drafted token is in the draft vocabulary"
