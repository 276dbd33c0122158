"""One error boundary: every failure is one line on stderr and an exit code, never a traceback.

2 bad input (files in another encoding, binary junk, an --out that is a file,
out of memory, permission denied), 3 an internal error with the traceback
saved to a file, 130 interrupted, 143 terminated, with no partial run folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pandas as pd
import pytest
import torch

import parity.commands.run as run_command
from fuzzcases import baseline_setup
from robustkit import (ROOT, call, catches, fork_main, hidden, log, one_line, run_args, tiny_scenario, visible,
                       wait)


def _raising(exc):
    def run_session(*args, **kwargs):
        raise exc
    return run_session


def test_device_out_of_memory_names_what_to_lower(tmp_path, monkeypatch):
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB\n"
               "of which 1.2 GiB is free. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    monkeypatch.setattr(run_command, "run_session", _raising(torch.OutOfMemoryError(message)))
    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 2 and one_line(err), err
    assert "out of memory" in err and "2.00 GiB" in err and "max_num_seqs" in err and "--modes" in err
    assert visible(tmp_path / "reports") == []


def test_permission_denied_is_one_line_naming_the_file(tmp_path, monkeypatch):
    denied = PermissionError(13, "Permission denied", "/srv/models/llama/model.safetensors")
    monkeypatch.setattr(run_command, "run_session", _raising(denied))
    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 2 and one_line(err) and "/srv/models/llama/model.safetensors: Permission denied" in err, err


def test_an_unexpected_error_is_exit_3_with_a_saved_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(run_command, "run_session", _raising(ZeroDivisionError("division by zero")))
    code, _, err = call(run_args(tiny_scenario(tmp_path)), cwd=tmp_path)
    assert code == 3 and one_line(err) and "internal error: ZeroDivisionError" in err, err
    saved = list(tmp_path.glob("parity-traceback-*.txt"))
    assert len(saved) == 1 and str(saved[0]) in err
    text = saved[0].read_text()
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError" in text and "argv:" in text


def test_prompts_that_are_not_utf8_are_one_line_with_file_and_line(tmp_path):
    prompts = tmp_path / "latin1.jsonl"
    prompts.write_bytes(b'{"text": "the turtle"}\n{"text": "caf\xe9 au lait"}\n')
    scenario = tiny_scenario(tmp_path, prompts=str(prompts))
    code, _, err = call(run_args(scenario), cwd=tmp_path)
    assert code == 2 and one_line(err), err
    assert f"{prompts}:2: not UTF-8" in err


@pytest.mark.parametrize("junk", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"key: value\n\x00\x01\x02 binary\n",
                                  b"a: [1, 2\nb: {c: d\n", b"\xff\xfe" + "prompts: x\n".encode("utf-16-le")])
def test_a_binary_or_broken_scenario_is_one_line(tmp_path, junk):
    path = tmp_path / "junk.yaml"
    path.write_bytes(junk)
    code, _, err = call(run_args(path), cwd=tmp_path)
    assert code == 2 and one_line(err) and str(path) in err, err


@pytest.mark.parametrize("arrivals, ok", [([0], True), ([0, 1, 2], True), ([0, 1], False), ([0, 1, 2, 3], False)])
def test_arrivals_give_one_step_per_request_or_one_for_all(tmp_path, arrivals, ok):
    from parity.errors import ParityInputError
    from parity.harness.scenario import load_scenario

    path = tiny_scenario(tmp_path, num_requests=3, arrivals=arrivals)
    if ok:
        steps = load_scenario(path).arrivals
        assert steps == ((arrivals[0],) * 3 if len(arrivals) == 1 else tuple(arrivals))
    else:
        with pytest.raises(ParityInputError, match=f"arrivals lists {len(arrivals)} steps for 3 requests"):
            load_scenario(path)


def _signal_self_while_writing(sig: int):
    """In the child: the second parquet file of the run folder is being written when `sig` arrives."""
    def before():
        original, calls = pd.DataFrame.to_parquet, []

        def to_parquet(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), sig)
                time.sleep(1)       # the handler runs at the next bytecode; nothing more is written
            return original(self, *args, **kwargs)
        pd.DataFrame.to_parquet = to_parquet
    return before


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_a_library_turned_into_its_own_error_still_exits_128_plus_signal(capsys, sig, code, word):
    """torch, interrupted mid-load, raised its own error in place of ours: the weights were called corrupt."""
    from parity.commands.boundary import guarded
    from parity.errors import ParityInputError

    def load():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)
        except BaseException as exc:     # what the library did with the signal's exception
            raise TypeError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from exc

    def command():
        try:
            load()
        except TypeError as exc:          # what the loader does with a library error
            raise ParityInputError(f"model.safetensors: unreadable or corrupt weights ({exc})") from exc

    assert guarded(command) == code
    err = capsys.readouterr().err
    assert word in err and "corrupt" not in err, err
    assert guarded(lambda: (_ for _ in ()).throw(TypeError("boom"))) == 3, "no signal: an internal error as before"


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_while_writing_exits_128_plus_signal_and_leaves_no_folder(tmp_path, sig, code, word):
    scenario = tiny_scenario(tmp_path)
    pid = fork_main(run_args(scenario), tmp_path, tmp_path / "logs", before=_signal_self_while_writing(sig))
    assert wait(pid) == code, log(tmp_path / "logs", pid)
    err = log(tmp_path / "logs", pid)
    assert one_line(err) and word in err, err
    reports = tmp_path / "reports"
    assert visible(reports) == [] and hidden(reports) == [], "the staging folder is removed on the way out"


def test_sigterm_to_a_real_parity_process_is_exit_143(tmp_path):
    """The whole path, `python -m parity` included: a SIGTERM once the command runs gives 143, no folder."""
    scenario = tiny_scenario(tmp_path, max_tokens=12, num_requests=2, arrivals=[0], max_num_seqs=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "parity", *run_args(scenario, modes="eager,full")], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not catches(proc.pid, signal.SIGTERM) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and one_line(err) and "terminated" in err, (proc.returncode, err)
    assert visible(tmp_path / "reports") == [] and hidden(tmp_path / "reports") == []


@pytest.mark.parametrize("args, needle", [
    (["--model", "llama3-eagle"], "weights not found locally"),
    (["--seed", "-1"], "--seed must be in 0..2**63-1"),
    (["--seed", str(1 << 70)], "--seed must be in 0..2**63-1"),
])
def test_missing_weights_and_impossible_seeds_are_one_line(tmp_path, args, needle):
    code, _, err = call(run_args(tiny_scenario(tmp_path), *args), cwd=tmp_path)
    assert code == 2 and one_line(err) and needle in err, err


def _edit(data: dict, path: str, value) -> dict:
    data = json.loads(json.dumps(data))
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


@pytest.mark.parametrize("path, value, needle", [
    ("scenario", 1, "no scenario object"),
    ("model", "tiny-llama3-eagle", "no model object"),
    ("model.name", "llama3-eagle", "baseline is for model 'llama3-eagle'"),
    ("schema_version", 2, "baseline schema 2"),
    ("k", "3", "'k' must be an integer"),
    ("modes.full.num_drafts", 0, "num_drafts >= 1"),
    ("modes.full.accepted_per_position", [True, False, False], "non-increasing"),
    ("modes.full.accepted_per_position", [0, 1, 1], "non-increasing"),
])
def test_hostile_baselines_are_one_line(tmp_path, path, value, needle):
    scenario, data = baseline_setup()
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(_edit(data, path, value)))
    code, _, err = call(["gate", "--scenario", str(scenario), "--backend", "emulated", "--modes", "eager,full",
                         "--baseline", str(baseline)])
    assert code == 2 and one_line(err) and needle in err, err


@pytest.mark.parametrize("edit, needle", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: text.replace('"schema_version": 2', '"schema_version": 7'), "summary schema 7"),
    (lambda text: text.replace('"k": 3', '"k": 1000000000000'), "'k' must be an integer in 1..32"),
    (lambda text: text.replace('"evidence": [', '"evidence": [{"a": 1}, '), "cannot render"),
    (lambda text: text.encode("utf-16"), "not UTF-8"),
])
def test_hostile_summaries_are_one_line(tmp_path, edit, needle):
    text = (ROOT / "tests" / "golden" / "drift-hidden-states" / "summary.json").read_text()
    (tmp_path / "run").mkdir()
    data = edit(text)
    (tmp_path / "run" / "summary.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    code, _, err = call(["report", str(tmp_path / "run")])
    assert code == 2 and one_line(err) and needle in err, err


@pytest.mark.parametrize("replace, extra, needle", [
    (("60.0", "1e300"), [], "counter value 1e+300 is not a count"),
    (("60.0", "NaN"), [], "counter value nan"),
    (("60.0", "-5"), [], "counter value -5.0"),
    (None, ["--num-drafts", str(10 ** 30)], "--num-drafts must be in 1..2**53"),
])
def test_absurd_vllm_counts_are_one_line(tmp_path, replace, extra, needle):
    """Found by `make fuzz`: a counter of 1e300 drafts overflowed the confidence intervals (exit 3)."""
    text = (ROOT / "tests" / "data" / "vllm-metrics.prom").read_text()
    metrics = tmp_path / "metrics.prom"
    metrics.write_text(text.replace(*replace, 1) if replace else text)
    printed = str(ROOT / "tests" / "data" / "seed000-full.txt")
    argv = ["import", str(metrics)] if replace else ["gate", "--import", printed, "--import", printed, *extra]
    code, _, err = call(argv)
    assert code == 2 and one_line(err) and needle in err, err
