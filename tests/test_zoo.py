"""The model zoo: what `parity models list` shows, where real weights come from, and what happens when
they are missing or will not fit (exit 2, one line that says what to do)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from parity.cli import main
from parity.errors import ParityInputError
from parity.models import memory, zoo

ROOT = Path(__file__).resolve().parents[1]
ALL_MODELS = ("tiny-llama3-eagle", "tiny-llama3-eagle3", "llama3-eagle", "llama3.1-eagle3")
# Meta-Llama-3-8B-Instruct's config (the shapes only).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "num_hidden_layers": 32, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "max_position_embeddings": 8192, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
EAGLE3_8B = {**LLAMA3_8B, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
             "draft_vocab_size": 32000, "torch_dtype": "float16"}


@pytest.fixture
def no_local_weights(monkeypatch, tmp_path):
    """An empty Hugging Face cache and no PARITY_*_PATH variables."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for name in list(__import__("os").environ):
        if name.startswith("PARITY_") and name.endswith("_PATH"):
            monkeypatch.delenv(name)
    return tmp_path


def fake_snapshot(cache, repo: str, config: dict):
    snapshot = cache / ("models--" + repo.replace("/", "--")) / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return snapshot


def test_run_real_model_without_weights_exits_2_with_one_line(no_local_weights, capsys):
    code = main(["run", "--model", "llama3-eagle", "--quiet", "--out", str(no_local_weights / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err, err
    for needed in ("meta-llama/Meta-Llama-3-8B-Instruct", "yuhuili/EAGLE-LLaMA3-Instruct-8B",  # what
                   str(no_local_weights / "hf" / "hub"),                                       # where it looked
                   "hf download", "--target-path", "--draft-path",                             # how to fix
                   "PARITY_LLAMA3_EAGLE_TARGET_PATH",
                   "parity models synth --shape llama3-8b --head eagle1", "parity run --model local"):  # no download
        assert needed in err, f"{needed!r} not in: {err}"
    assert not (no_local_weights / "out").exists()


@pytest.mark.parametrize("name", ["llama3-eagle", "llama3.1-eagle3"])
def test_the_no_download_route_is_a_synth_command_and_the_local_run_of_its_output(no_local_weights, capsys, name):
    from parity.builders.synth.spec import HEADS, SHAPES
    assert main(["run", "--model", name, "--quiet"]) == 2
    synth, run = re.findall(r"`(parity models synth [^`]*|parity run --model local [^`]*)`", capsys.readouterr().err)
    shape, head = zoo.ZOO[name].synth
    assert shape in SHAPES and head in HEADS and zoo.ZOO[name].head == head
    out = synth.split("--out ")[1]
    assert synth == f"parity models synth --shape {shape} --head {head} --out {out}"
    assert run == (f"parity run --model local --target-path {out}/target --draft-path {out}/{head} "
                   f"--scenario scenarios/llama3-eagle.yaml")


@pytest.mark.parametrize("name, scenario", [("llama3-eagle", "scenarios/llama3-eagle.yaml"),
                                            ("llama3.1-eagle3", "scenarios/llama3-eagle.yaml"),
                                            ("tiny-llama3-eagle", "scenarios/default.yaml"),
                                            ("local", "scenarios/default.yaml")])
def test_a_model_runs_its_own_scenario_unless_one_is_given(name, scenario):
    from parity.commands.common import run_request
    from parity.commands.options import add_common
    parser = argparse.ArgumentParser()
    add_common(parser)
    paths = ["--target-path", "t", "--draft-path", "d"] if name == "local" else []
    assert run_request(parser.parse_args(["--model", name, *paths])).scenario_path == scenario
    given = parser.parse_args(["--model", name, *paths, "--scenario", "scenarios/s000-eagle-full-k7.yaml"])
    assert run_request(given).scenario_path == "scenarios/s000-eagle-full-k7.yaml"
    assert (ROOT / zoo.ZOO[name].scenario).is_file()


def test_make_parity_leaves_the_scenario_to_the_model_unless_scenario_is_given(tmp_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on this machine")
    stamp = tmp_path / "bootstrapped"       # newer than pyproject.toml: nothing to bootstrap, nothing runs (-n)
    stamp.touch()

    def dry(*variables):
        return subprocess.run([make, "-n", "parity", f"STAMP={stamp}", *variables], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    assert "--model llama3-eagle" in dry("MODEL=llama3-eagle") and "--scenario" not in dry("MODEL=llama3-eagle")
    assert "--scenario scenarios/long-context.yaml" in dry("MODEL=llama3-eagle", "SCENARIO=scenarios/long-context.yaml")


def test_explicit_path_without_a_checkpoint_is_named(no_local_weights, capsys):
    empty = no_local_weights / "empty"
    empty.mkdir()
    assert main(["run", "--model", "llama3.1-eagle3", "--target-path", str(empty), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(empty) in err and "config.json" in err and "--target-path" in err


def test_models_list_shows_all_four(no_local_weights, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in ALL_MODELS:
        assert name in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert "embedded" in rows["tiny-llama3-eagle3"] and "eagle3" in rows["tiny-llama3-eagle3"]
    assert "missing" in rows["llama3-eagle"] and "missing" in rows["llama3.1-eagle3"]
    assert set(ALL_MODELS) <= set(zoo.ZOO)


def test_real_pair_resolves_from_the_local_cache_and_env(no_local_weights, monkeypatch):
    cache = no_local_weights / "hf" / "hub"
    target = fake_snapshot(cache, "meta-llama/Llama-3.1-8B-Instruct", LLAMA3_8B)
    draft = fake_snapshot(cache, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", EAGLE3_8B)
    assert zoo.resolve_paths("llama3.1-eagle3") == (target, draft)
    assert zoo.availability("llama3.1-eagle3") == "local"
    other = no_local_weights / "elsewhere"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(EAGLE3_8B))
    monkeypatch.setenv("PARITY_LLAMA3_1_EAGLE3_DRAFT_PATH", str(other))
    assert zoo.resolve_paths("llama3.1-eagle3") == (target, other)


def test_embedded_eagle3_pair_loads_the_eagle3_head():
    from parity.models.eagle3 import Eagle3Head
    from parity.models.pair import load_pair
    pair = load_pair("tiny-llama3-eagle3")
    assert isinstance(pair.head, Eagle3Head)
    assert pair.target.aux_layers == (0, 1, 2)
    assert pair.head.lm_head.weight.shape[0] == pair.target.config.vocab_size
    assert load_pair("tiny-llama3-eagle").target.aux_layers == ()


# --- the memory check ------------------------------------------------------------------------


def test_parameter_estimate_matches_llama3_8b():
    assert memory.target_params(LLAMA3_8B) == 8_030_261_248
    # EAGLE-3 head: fc 3h->h, one layer with qkv over 2h, norm, 32000-token lm_head.
    assert 0.40e9 < memory.head_params(EAGLE3_8B) < 0.45e9   # ~850 MB in fp16, as published


@pytest.fixture
def real_size_dirs(tmp_path):
    target, draft = tmp_path / "t", tmp_path / "d"
    for folder, config in ((target, LLAMA3_8B), (draft, EAGLE3_8B)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    return target, draft


def test_too_little_gpu_memory_is_one_line(real_size_dirs, monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (12 << 30, 80 << 30))
    with pytest.raises(ParityInputError) as excinfo:
        memory.check_memory("llama3.1-eagle3", *real_size_dirs, torch.bfloat16, "cuda")
    message = str(excinfo.value)
    assert "\n" not in message and "GPU memory" in message and "12.0 GiB free" in message
    assert "bfloat16" in message
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 << 30, 80 << 30))
    monkeypatch.setattr(memory, "_available_ram", lambda: 64 << 30)
    est = memory.check_memory("llama3.1-eagle3", *real_size_dirs, torch.bfloat16, "cuda")
    assert 16.5e9 < est["weights"] < 17.5e9


def test_too_little_ram_is_one_line(real_size_dirs, monkeypatch):
    monkeypatch.setattr(memory, "_available_ram", lambda: 16 << 30)
    with pytest.raises(ParityInputError) as excinfo:
        memory.check_memory("llama3.1-eagle3", *real_size_dirs, torch.float32, "cpu")
    message = str(excinfo.value)
    assert "\n" not in message and "CPU memory" in message and "--dtype" in message
