"""Hugging Face-format loading: round trips and one-line errors that name the file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from parity.errors import ParityInputError
from parity.builders import saver
from parity.models import loader
from parity.models.eagle1 import Eagle1Head
from parity.models.llama import build_target
from parity.models.paged_attention import ATTN_IMPLEMENTATION


def small_config(**overrides) -> LlamaConfig:
    values = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                  rope_theta=500000.0, tie_word_embeddings=False)
    values.update(overrides)
    return LlamaConfig(**values)


def head_for(config: LlamaConfig, target, fc_bias: bool = False) -> Eagle1Head:
    head_config = LlamaConfig.from_dict(config.to_dict())
    head_config.num_hidden_layers = 1
    return Eagle1Head(head_config, fc_bias=fc_bias).share(target.embed_tokens, target.lm_head)


@pytest.fixture
def saved_pair(tmp_path):
    torch.manual_seed(0)
    config = small_config()
    target = build_target(config)
    head = head_for(config, target)
    saver.save_target(target, None, tmp_path / "target")
    saver.save_eagle1(head, tmp_path / "eagle")
    return target, head, tmp_path / "target", tmp_path / "eagle"


def assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_one_line_naming(excinfo, name: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    assert name in message, message


@pytest.mark.parametrize("overrides", [
    {},
    # non-default shapes: tied embeddings, MHA, 3 layers, odd sizes
    {"hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": 16,
     "intermediate_size": 40, "num_hidden_layers": 3, "vocab_size": 37, "tie_word_embeddings": True},
])
def test_round_trip(tmp_path, overrides):
    torch.manual_seed(1)
    config = small_config(**overrides)
    target = build_target(config)
    head = head_for(config, target, fc_bias=bool(overrides))
    saver.save_target(target, None, tmp_path / "t")
    saver.save_eagle1(head, tmp_path / "e")

    loaded = loader.load_target(tmp_path / "t")
    assert loaded.config._attn_implementation == ATTN_IMPLEMENTATION
    assert_same_state(target.hf.state_dict(), loaded.hf.state_dict())
    if config.tie_word_embeddings:
        assert loaded.lm_head.weight is loaded.embed_tokens.weight
    loaded_head = loader.load_eagle1(tmp_path / "e", loaded)
    assert loaded_head.config._attn_implementation == ATTN_IMPLEMENTATION
    assert loaded_head.embed_tokens is loaded.embed_tokens and loaded_head.lm_head is loaded.lm_head
    assert_same_state(head.head_state_dict(), loaded_head.head_state_dict())
    assert all(not t.is_meta for t in list(loaded.hf.buffers()) + list(loaded_head.buffers()))

    stored = load_file(str(tmp_path / "e" / "model.safetensors"))
    assert "embed_tokens.weight" not in stored and "layers.0.input_layernorm.weight" not in stored
    assert ("fc.bias" in stored) == bool(overrides)


def test_dtype_and_pytorch_bin(saved_pair, tmp_path):
    target, _, target_dir, _ = saved_pair
    state = load_file(str(target_dir / "model.safetensors"))
    (target_dir / "model.safetensors").unlink()
    torch.save(state, target_dir / "pytorch_model.bin")
    loaded = loader.load_target(target_dir, dtype=torch.bfloat16)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, target.lm_head.weight.to(torch.bfloat16))


def test_sharded_safetensors(saved_pair):
    target, _, target_dir, _ = saved_pair
    state = load_file(str(target_dir / "model.safetensors"))
    (target_dir / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, shard_keys in shards.items():
        save_file({k: state[k] for k in shard_keys}, str(target_dir / name))
    index = {"weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (target_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_same_state(target.hf.state_dict(), loader.load_target(target_dir).hf.state_dict())


def test_head_tolerates_embeddings_and_input_layernorm(saved_pair):
    target, head, _, eagle_dir = saved_pair
    file = eagle_dir / "model.safetensors"
    state = load_file(str(file))
    state["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
    state["layers.0.input_layernorm.weight"] = torch.ones(target.config.hidden_size)
    save_file(state, str(file))
    assert_same_state(head.head_state_dict(), loader.load_eagle1(eagle_dir, target).head_state_dict())


def test_tokenizer_round_trip(tmp_path):
    from parity.builders.training.tokenizer import build_tokenizer, save_tokenizer
    save_tokenizer(build_tokenizer(), tmp_path)
    tok = loader.load_tokenizer(tmp_path)
    text = "Once upon a time, there was a kind baker named Tom who lived in Oakvale."
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    saver.save_target(build_target(small_config()), tok, tmp_path / "copy")
    assert loader.load_tokenizer(tmp_path / "copy")(text)["input_ids"] == ids


# --- errors: each is one line naming the file --------------------------------------------


def test_missing_directory(tmp_path):
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(tmp_path / "nowhere")
    assert_one_line_naming(excinfo, "nowhere")


def test_missing_config(saved_pair):
    _, _, target_dir, _ = saved_pair
    (target_dir / "config.json").unlink()
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(target_dir)
    assert_one_line_naming(excinfo, "config.json")


def test_invalid_config_json(saved_pair):
    _, _, target_dir, _ = saved_pair
    (target_dir / "config.json").write_text("{not json")
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(target_dir)
    assert_one_line_naming(excinfo, "config.json")


def test_missing_weights(saved_pair):
    _, _, target_dir, _ = saved_pair
    (target_dir / "model.safetensors").unlink()
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(target_dir)
    assert_one_line_naming(excinfo, "model.safetensors")


def test_missing_tokenizer(saved_pair):
    _, _, target_dir, _ = saved_pair
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_tokenizer(target_dir)
    assert_one_line_naming(excinfo, "tokenizer.json")


@pytest.mark.parametrize("which", ["target", "eagle"])
def test_truncated_safetensors(saved_pair, which):
    target, _, target_dir, eagle_dir = saved_pair
    directory = target_dir if which == "target" else eagle_dir
    file = directory / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(directory) if which == "target" else loader.load_eagle1(directory, target)
    assert_one_line_naming(excinfo, "model.safetensors")


def test_missing_key(saved_pair):
    _, _, target_dir, _ = saved_pair
    file = target_dir / "model.safetensors"
    state = load_file(str(file))
    del state["model.norm.weight"]
    save_file(state, str(file))
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(target_dir)
    assert_one_line_naming(excinfo, "model.safetensors")
    assert "model.norm.weight" in str(excinfo.value) and "1 missing" in str(excinfo.value)


def test_unexpected_key(saved_pair):
    target, _, _, eagle_dir = saved_pair
    file = eagle_dir / "model.safetensors"
    state = load_file(str(file))
    state["layers.1.mlp.up_proj.weight"] = torch.zeros(2, 2)
    save_file(state, str(file))
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_eagle1(eagle_dir, target)
    assert_one_line_naming(excinfo, "model.safetensors")
    assert "layers.1.mlp.up_proj.weight" in str(excinfo.value)


def test_wrong_shape(saved_pair):
    _, _, target_dir, _ = saved_pair
    file = target_dir / "model.safetensors"
    state = load_file(str(file))
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(5, 32)
    save_file(state, str(file))
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_target(target_dir)
    assert_one_line_naming(excinfo, "model.safetensors")
    assert "k_proj" in str(excinfo.value) and "(16, 32)" in str(excinfo.value) and "(5, 32)" in str(excinfo.value)


def test_head_hidden_size_mismatch(tmp_path):
    torch.manual_seed(2)
    target = build_target(small_config())
    other = small_config(hidden_size=48)
    head = head_for(other, build_target(other))
    saver.save_eagle1(head, tmp_path / "eagle")
    with pytest.raises(ParityInputError) as excinfo:
        loader.load_eagle1(tmp_path / "eagle", target)
    assert_one_line_naming(excinfo, "config.json")
    assert "hidden_size" in str(excinfo.value)
