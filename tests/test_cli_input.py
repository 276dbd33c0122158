"""Bad input gets one line on stderr and exit code 2: no traceback, no report folder left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from parity.cli import main
from parity.harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = yaml.safe_load((ROOT / "scenarios/default.yaml").read_text())


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("PROMPTS", str(ROOT / "scenarios/prompts/default.jsonl")))
    return path


def run_cli(capsys, args) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    return code, err


BAD_SCENARIOS = {
    "typo in a key": ("prompts: PROMPTS\nnum_speculativ_tokens: 3\n", 2, "unknown key 'num_speculativ_tokens'"),
    "K=0": ("prompts: PROMPTS\nnum_speculative_tokens: 0\n", 2, "num_speculative_tokens (K) must be an integer in 1..32"),
    # The engine's own rules (engine/config.py), told at the line of the key they name.
    "batch too small for K": ("prompts: PROMPTS\nmax_num_seqs: 8\nmax_num_batched_tokens: 16\n", 3,
                              "max_num_batched_tokens 16 cannot hold 8 decoding requests"),
    "context too short for K": ("prompts: PROMPTS\nnum_speculative_tokens: 7\nmax_model_len: 8\nblock_size: 4\n", 3,
                                "max_model_len 8 is too small for K=7"),
    "NaN temperature": ("prompts: PROMPTS\ntemperature: .nan\n", 2, "temperature must be >= 0"),
    "prompts file missing": ("prompts: nowhere.jsonl\n", 1, "not found"),
    "capture size 0": ("prompts: PROMPTS\ncapture_sizes: [0, 2, 4]\n", 2, "capture_sizes must be positive"),
    "unsorted capture sizes": ("prompts: PROMPTS\ncapture_sizes: [4, 2]\n", 2, "strictly increasing"),
    "wrong type": ("prompts: PROMPTS\nmax_tokens: many\n", 2, "max_tokens must be a positive integer"),
    "unknown mode": ("prompts: PROMPTS\nmodes: [eager, turbo]\n", 2, "unknown mode 'turbo'"),
    "not a mapping": ("- just\n- a list\n", 1, "must be a mapping"),
    "unknown tolerance": ("prompts: PROMPTS\ntolerances:\n  logprob: 1\n", 3, "unknown tolerance 'logprob'"),
}


@pytest.mark.parametrize("case", list(BAD_SCENARIOS))
def test_bad_scenario_is_one_line_with_file_and_line(tmp_path, capsys, case):
    text, line, reason = BAD_SCENARIOS[case]
    path = write(tmp_path, text)
    out = tmp_path / "report"
    code, err = run_cli(capsys, ["run", "--scenario", str(path), "--out", str(out), "--quiet"])
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}:{line}:" in err and reason in err, err
    assert not out.exists() and not list(tmp_path.glob(".report*"))


@pytest.mark.parametrize("args, needle", [
    (["run", "--model", "nope"], "unknown model 'nope'; known models: tiny-llama3-eagle"),
    (["run", "--modes", "eager,fast"], "unknown mode 'fast'"),
    (["run", "--inject", "no-such-bug"], "unknown fault 'no-such-bug'"),
    (["run", "--backend", "tpu"], "invalid choice"),
    (["report", "/nonexistent/run"], "summary.json: not found"),
    (["bisect", "--mode", "eager"], "eager is the reference"),
    (["run", "--tp-all-reduce", "registered"], "--tp-all-reduce only applies to a tensor-parallel run: add --tp 2"),
    (["run", "--tp-timeout", "5"], "--tp-timeout only applies to a tensor-parallel run"),
    (["models", "synth", "--shape", "llama3-70b", "--head", "eagle1", "--at-load", "--peak", "0.6", "--out",
      "/nonexistent/p"], "--peak calibrates weights, and --at-load pairs are drawn at load"),
    (["models", "synth", "--shape", "tiny", "--head", "eagle1", "--scale", "0.1", "--out", "/nonexistent/p"],
     "--scale is the at-load recipe's"),
])
def test_bad_options_exit_2_in_one_line(capsys, args, needle):
    code, err = run_cli(capsys, args)
    assert code == 2
    assert err.count("\n") == 1 and needle in err, err


def test_cuda_backend_without_cuda_is_exit_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, err = run_cli(capsys, ["run", "--backend", "cuda"])
    assert code == 2 and "CUDA is not available" in err


def test_prompt_longer_than_max_model_len_is_exit_2(tmp_path, capsys):
    long_prompt = tmp_path / "long.jsonl"
    long_prompt.write_text('{"id": "long", "text": "' + "the turtle looked worried . " * 40 + '"}\n')
    path = tmp_path / "long.yaml"
    path.write_text(f"prompts: {long_prompt}\nmax_model_len: 64\nmax_num_batched_tokens: 256\n")
    code, err = run_cli(capsys, ["run", "--scenario", str(path), "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 2 and "max_model_len 64" in err, err


def test_every_shipped_scenario_loads():
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        scenario = load_scenario(path)
        assert scenario.num_requests >= 1 and scenario.prompts
