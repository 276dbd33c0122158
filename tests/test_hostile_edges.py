"""The last hostile edges (closed pipes, non-finite options, devices and FIFOs, absurd sizes, coerced input,
terminal widths, signals while starting, run-to-run determinism): each is one line and exit 2, or the right
verdict and exit code, never a traceback, a hang or a lost run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.robustkit import (ROOT, call, catches, complete_run, fork_with_stdout_pipe, forked_cli, one_line, run_args,
                             tiny_scenario)

EMBEDDED = ROOT / "parity" / "assets" / "tiny-llama3-eagle"


@pytest.mark.parametrize("lines", [1, 0], ids=["head-1", "reader-gone-at-once"])
def test_a_reader_that_leaves_early_loses_no_run_and_no_verdict(tmp_path, lines):
    scenario = tiny_scenario(tmp_path)
    code, read = fork_with_stdout_pipe(run_args(scenario, "--verbose", "--out", str(tmp_path / "run"),
                                                 modes="eager,full"), tmp_path, lines)
    assert code == 0, "a passing run exits 0 whoever reads its output"
    assert len(read) == lines
    assert complete_run(tmp_path / "run"), "the run folder is saved although nobody read the console"


def test_a_gate_whose_reader_left_still_exits_with_its_verdict(tmp_path):
    scenario = tiny_scenario(tmp_path)
    code, _ = fork_with_stdout_pipe(["gate", "--scenario", str(scenario), "--backend", "emulated",
                                      "--modes", "eager,full"], tmp_path, 0)
    assert code == 0


@pytest.mark.parametrize("option, value, needle", [
    ("--device-memory", "nan", "must be a finite number"),
    ("--device-memory", "inf", "must be a finite number"),
    ("--device-memory", "0", "must be > 0"),
    ("--simulate-padding-numerics", "nan", "must be a finite number"),
    ("--simulate-padding-numerics", "inf", "must be a finite number"),
    ("--simulate-padding-numerics", "-1", "must be >= 0"),
])
def test_non_finite_options_are_one_line_before_anything_runs(tmp_path, option, value, needle):
    code, _, err = call(run_args(tiny_scenario(tmp_path), f"{option}={value}", "--out", str(tmp_path / "run")))
    assert code == 2 and one_line(err) and needle in err and option in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, needle", [
    (["bench", "--iters", "0"], "must be in 1.."),
    (["bench", "--seeds", "nan"], "expected a whole number"),
    (["bench", "false-alarms", "--temperature", "inf"], "must be a finite number"),
    (["models", "synth", "--shape", "tiny", "--head", "eagle1", "--out", "x", "--acceptance", "nan"], "--acceptance must be strictly between 0 and 1"),
    (["faults", "matrix", "--simulate-padding-numerics", "nan"], "must be a finite number"),
    (["run", "--modes", ""], "an empty mode name"),
    (["run", "--modes", "eager,,full"], "an empty mode name"),
])
def test_every_numeric_option_and_mode_list_is_checked_as_it_is_parsed(argv, needle):
    code, _, err = call(argv)
    assert code == 2 and one_line(err) and needle in err, err


def _local_pair(tmp_path: Path, **target_config) -> tuple[str, str]:
    target, draft = tmp_path / "target", tmp_path / "eagle"
    shutil.copytree(EMBEDDED / "target", target)
    shutil.copytree(EMBEDDED / "eagle", draft)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **target_config}))
    return str(target), str(draft)


@pytest.mark.parametrize("edit, needle", [
    ({"hidden_size": -64}, "'hidden_size' must be a positive integer"),
    ({"num_hidden_layers": 0}, "'num_hidden_layers' must be a positive integer"),
    ({"intermediate_size": 2.5}, "'intermediate_size' must be a positive integer"),
    ({"vocab_size": 1 << 40}, "'vocab_size' must be a positive integer up to"),
])
def test_a_checkpoint_config_with_an_impossible_size_is_one_line(tmp_path, edit, needle):
    target, draft = _local_pair(tmp_path, **edit)
    code, _, err = call(run_args(tiny_scenario(tmp_path), "--model", "local", "--target-path", target,
                                 "--draft-path", draft))
    assert code == 2 and one_line(err) and needle in err and "config.json" in err, err


def test_an_eagle1_head_of_another_vocabulary_is_refused(tmp_path):
    target, draft = _local_pair(tmp_path)
    config = json.loads((Path(draft) / "config.json").read_text())
    (Path(draft) / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    code, _, err = call(run_args(tiny_scenario(tmp_path), "--model", "local", "--target-path", target,
                                 "--draft-path", draft))
    assert code == 2 and one_line(err) and "head vocab_size" in err and "target's vocabulary" in err, err


@pytest.mark.parametrize("overrides, needle", [
    ({"max_model_len": 1 << 20, "max_num_batched_tokens": 64}, "exceeds the model's context (512"),
    ({"block_size": 1 << 20}, "block_size must be at most 1024"),
    ({"block_size": 128}, "block_size 128 is larger than max_model_len 64"),
    ({"num_requests": 1 << 20, "max_tokens": 1 << 20, "arrivals": [0]}, "hours of work"),
])
def test_sizes_that_would_run_for_hours_are_refused_before_loading(tmp_path, overrides, needle):
    started = time.monotonic()
    code, _, err = call(run_args(tiny_scenario(tmp_path, **overrides)))
    assert code == 2 and one_line(err) and needle in err, err
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("source", ["/dev/zero", "/dev/urandom", "fifo", "folder"])
def test_import_refuses_devices_fifos_and_folders_at_once(tmp_path, source):
    if source == "fifo":
        os.mkfifo(tmp_path / "fifo")      # its open would block until a writer came
    path = {"fifo": str(tmp_path / "fifo"), "folder": str(tmp_path)}.get(source, source)
    started = time.monotonic()
    code, _, err = forked_cli(["import", path])
    kind = {"fifo": "a FIFO", "folder": "a folder"}.get(source, "a device")
    assert code == 2 and one_line(err) and f"{kind}, not a" in err, err
    assert time.monotonic() - started < 30


def test_an_oversize_import_is_refused_by_its_stated_cap(tmp_path):
    big = tmp_path / "metrics.prom"
    with open(big, "wb") as out:
        out.truncate((16 << 20) + 1)
    code, _, err = call(["import", str(big)])
    assert code == 2 and one_line(err) and "larger than 16 MiB" in err, err


@pytest.mark.parametrize("line, needle", [
    ({"text": 5}, "'text' must be a non-empty string, got 5"),
    ({"text": None}, "'text' must be a non-empty string, got None"),
    ({"text": ""}, "'text' must be a non-empty string"),
    ({"text": ["a"]}, "'text' must be a non-empty string"),
    ({"id": {"a": 1}, "text": "hello"}, "'id' must be a string or an integer"),
    ({"id": True, "text": "hello"}, "'id' must be a string or an integer"),
    ([1, 2], "expected a JSON object with a 'text' field"),
])
def test_prompt_lines_of_the_wrong_type_are_refused_not_coerced(tmp_path, line, needle):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "a fine prompt"}) + "\n" + json.dumps(line) + "\n")
    code, _, err = call(run_args(tiny_scenario(tmp_path, prompts=str(prompts))))
    assert code == 2 and one_line(err) and needle in err and "p.jsonl:2" in err, err


def _saved_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    assert call(run_args(tiny_scenario(tmp_path), "--out", str(out), modes="eager,full"))[0] == 0
    return out


def test_a_summary_with_an_unknown_verdict_is_refused_not_shown_as_pass(tmp_path):
    out = _saved_run(tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "verdict": "bogus"}))
    code, stdout, err = call(["report", str(out)])
    assert code == 2 and one_line(err) and "'verdict' must be one of pass, drift, not_exercised" in err, err
    assert "PASS" not in stdout


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"COLUMNS": "0"}, {"COLUMNS": "7"},
                                 {"COLUMNS": "junk"}], ids=["ascii", "columns-0", "columns-7", "columns-junk"])
def test_report_prints_its_verdict_line_in_any_encoding_and_width(tmp_path, env):
    out = _saved_run(tmp_path)
    encoding = env.pop("PYTHONIOENCODING", None)
    code, stdout, err = forked_cli(["report", str(out)], encoding=encoding, **env)
    assert code == 0 and err == "", err
    assert "PASS tiny-llama3-eagle / tiny (emulated)" in " ".join(stdout.split())


def test_two_identical_runs_give_identical_summaries_but_for_created_and_measured(tmp_path):
    summaries = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert call(run_args(tiny_scenario(tmp_path), "--out", str(out), modes="eager,full"))[0] == 0
        summary = json.loads((out / "summary.json").read_text())
        assert set(summary["measured"]) == {"timing", "memory", "memory_plan", "concurrency"}
        summaries.append({k: v for k, v in summary.items() if k not in ("created", "measured")})
    assert json.dumps(summaries[0], sort_keys=True) == json.dumps(summaries[1], sort_keys=True)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_a_signal_while_starting_is_one_line(tmp_path, sig, code, word):
    """The interpreter's own start-up is the subject here: a fresh `python -m parity`, signalled as soon as its
    own handlers are in (parity/__main__.py, before it imports torch, which takes seconds). Python itself
    catches SIGINT from its first milliseconds, so the sign that ours are in is a caught SIGTERM."""
    proc = subprocess.Popen([sys.executable, "-m", "parity", "run", "--scenario", str(tiny_scenario(tmp_path))],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not catches(proc.pid, signal.SIGTERM) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    # NOTE: the command line reaches its error boundary ~50 ms after these handlers are in (it imports torch only
    # once a command runs): a signal landing there is the boundary's line, "interrupted" or "terminated" alike.
    assert proc.returncode == code and one_line(err) and word in err, (proc.returncode, err)
    assert not (tmp_path / "reports").exists()
