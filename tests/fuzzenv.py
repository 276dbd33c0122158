"""Fuzzed options and environments: numeric and list options, checkpoint configs, devices and FIFOs where
files belong, readers that leave early, terminal widths and encodings, signals while starting.

Each kind draws a hostile case, runs the CLI (in process, in a forked child
where the case changes the process: its environment, its stdout, a read that
might block; in a fresh interpreter for signals while it starts) and checks
fuzzkit.check_outcome plus what the kind promises. Input that must be refused
(a NaN size, an empty mode list, a negative size in config.json) counts as a
failure when it exits 0 or 1: a coerced value is a silent wrong answer.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import strategies as st

from fuzzcases import COUNTS, OUTCOMES, TOO_LARGE, cheap_engine
from fuzzkit import NASTY_NUMBERS, NASTY_STRINGS, SUMMARIES, VLLM_FILES, check_outcome, mutated
from parity.graphs.modes import MODES
from parity.harness.forked import fork_map
from parity.models.checkpoint import MAX_SIZE, REQUIRED_SIZES, SIZE_KEYS
from robustkit import ROOT, call, catches, complete_run, fork_with_stdout_pipe, forked_cli, one_line, tiny_scenario

EMBEDDED = ROOT / "parity" / "assets" / "tiny-llama3-eagle"


def _tally(kind: str, code) -> None:
    COUNTS[kind] += 1
    OUTCOMES[(kind, code)] += 1


def _must_refuse(code: int, err: str, why: str) -> None:
    assert code == 2, f"exit {code} on input that must be refused ({why}): {err[-500:]}"


def _run_tiny(folder: Path, *extra: str, modes: str = "eager,full") -> list[str]:
    return ["run", "--scenario", str(tiny_scenario(folder)), "--backend", "emulated", "--quiet", "--no-bisect",
            "--modes", modes, "--out", str(folder / "run"), *extra]


# --- numeric and list options --------------------------------------------------------------------------

def _number(text: str, kind=float):
    try:
        return kind(text)
    except (ValueError, OverflowError):
        return None


def _finite_at_least(low: float, strict: bool):
    def valid(text: str) -> bool:
        value = _number(text)
        return value is not None and math.isfinite(value) and (value > low if strict else value >= low)
    return valid


def _whole(low: int, high: int):
    def valid(text: str) -> bool:
        value = _number(text, int)
        return value is not None and low <= value <= high
    return valid


def _modes(text: str) -> bool:
    parts = [m.strip() for m in text.split(",")]
    return text.strip() == "all" or (all(parts) and all(m in MODES for m in parts))


# option -> (the command around it, given the folder and the value; whether the value is valid)
OPTIONS = {
    "--device-memory": (lambda f, v: _run_tiny(f, f"--device-memory={v}"),
                        lambda v: _finite_at_least(0, True)(v) and float(v) <= 1 << 20),
    "--simulate-padding-numerics": (lambda f, v: _run_tiny(f, f"--simulate-padding-numerics={v}"),
                                    _finite_at_least(0, False)),
    "--seed": (lambda f, v: _run_tiny(f, f"--seed={v}"), _whole(0, (1 << 63) - 1)),
    "--modes": (lambda f, v: _run_tiny(f, modes=v), _modes),
    "--iters": (lambda f, v: ["bench", "--skip", "latency,parity,bisect,audit,alarms,analysis", "--json",
                              str(f / "bench.json"), f"--iters={v}"], _whole(1, 1 << 20)),
    "--num-drafts": (lambda f, v: ["import", str(VLLM_FILES[-1]), f"--num-drafts={v}"], _whole(1, 1 << 53)),
}
option_values = st.one_of(NASTY_NUMBERS.map(str), NASTY_STRINGS,
                          st.sampled_from(["nan", "NaN", "inf", "-inf", "1e400", "-0", " 3", "0x10", "1_000", ""]))


def option_case(option: str, value: str) -> None:
    command, valid = OPTIONS[option]
    with tempfile.TemporaryDirectory() as tmp:
        with cheap_engine():
            code, out, err = call(command(Path(tmp), value))
        _tally("options", "too large" if TOO_LARGE in err else code)
        if TOO_LARGE in err:
            return
        check_outcome(code, out, err, Path(tmp) / "run")
        if not valid(value):
            _must_refuse(code, err, f"{option}={value!r}")


# --- checkpoint configs --------------------------------------------------------------------------------

def _config(which: str) -> dict:
    return json.loads((EMBEDDED / which / "config.json").read_text())


configs = st.sampled_from(["target", "eagle"]).flatmap(
    lambda which: st.tuples(st.just(which), mutated(_config(which))))


def _bad_size(config) -> str | None:
    if not isinstance(config, dict):
        return "not an object"
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None and key not in REQUIRED_SIZES:      # an optional size left out or null: derived
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
            return f"{key}={value!r}"
    return None


def config_case(which_and_config) -> None:
    which, config = which_and_config
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("target", "eagle"):
            shutil.copytree(EMBEDDED / part, Path(tmp) / part)
        (Path(tmp) / which / "config.json").write_text(json.dumps(config, default=str))
        with cheap_engine():
            code, out, err = call(_run_tiny(Path(tmp), "--model", "local", "--target-path", f"{tmp}/target",
                                            "--draft-path", f"{tmp}/eagle"))
        _tally("configs", "too large" if TOO_LARGE in err else code)
        if TOO_LARGE in err:
            return
        check_outcome(code, out, err, Path(tmp) / "run")
        bad = _bad_size(config)
        if bad:
            _must_refuse(code, err, f"{which}/config.json {bad}")


# --- devices, FIFOs, folders and oversize files where a file belongs ------------------------------------

SOURCES = ("/dev/zero", "/dev/urandom", "/dev/null", "fifo", "folder", "oversize")
READERS = ("scenario", "prompts", "import", "summary", "baseline", "config")


def _source(folder: Path, kind: str) -> Path:
    if kind == "fifo":
        os.mkfifo(folder / "fifo")
        return folder / "fifo"
    if kind == "folder":
        (folder / "folder").mkdir()
        return folder / "folder"
    if kind == "oversize":
        with open(folder / "big", "wb") as out:
            out.truncate((16 << 20) + 1)
        return folder / "big"
    return Path(kind)


def _reader_argv(folder: Path, reader: str, source: Path) -> list[str]:
    if reader == "scenario":
        return ["run", "--scenario", str(source), "--backend", "emulated", "--quiet"]
    if reader == "prompts":
        return ["run", "--scenario", str(tiny_scenario(folder, prompts=str(source))), "--backend", "emulated",
                "--quiet", "--modes", "eager"]
    if reader == "import":
        return ["import", str(source)]
    if reader == "summary":
        (folder / "run").mkdir()
        (folder / "run" / "summary.json").symlink_to(source)
        return ["report", str(folder / "run")]
    if reader == "baseline":
        return ["gate", "--scenario", str(tiny_scenario(folder)), "--backend", "emulated", "--modes", "eager,full",
                "--baseline", str(source)]
    for part in ("target", "eagle"):
        shutil.copytree(EMBEDDED / part, folder / part)
    (folder / "target" / "config.json").unlink()
    (folder / "target" / "config.json").symlink_to(source)
    return ["run", "--scenario", str(tiny_scenario(folder)), "--backend", "emulated", "--quiet", "--model", "local",
            "--target-path", str(folder / "target"), "--draft-path", str(folder / "eagle")]


def device_case(reader: str, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        argv = _reader_argv(folder, reader, _source(folder, kind))
        # NOTE: in a child with a deadline: a reader that blocks on the FIFO would hang this process forever.
        [outcome] = fork_map(lambda a: call(a), [argv], timeout=60, return_errors=True)
        assert not isinstance(outcome, Exception), f"{reader} from {kind}: {outcome}"
        code, out, err = outcome
        _tally("devices", code)
        check_outcome(code, out, err)
        _must_refuse(code, err, f"{reader} from {kind}")


# --- readers that leave early, terminal widths and encodings --------------------------------------------

def pipe_case(command: str, lines: int, verbose: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if command == "report":
            summary = SUMMARIES[lines % len(SUMMARIES)]
            argv, expected = ["report", str(summary.parent)], int(json.loads(summary.read_text())["verdict"] != "pass")
        elif command == "gate":
            argv, expected = ["gate", "--scenario", str(tiny_scenario(folder)), "--backend", "emulated", "--modes",
                              "eager,full"], 0
        else:
            argv, expected = _run_tiny(folder, *(["--verbose"] if verbose else [])), 0
        code, _ = fork_with_stdout_pipe(argv, folder, lines)
        _tally("pipes", code)
        assert code == expected, f"{command} with its reader gone after {lines} line(s): exit {code}, not {expected}"
        if command == "run":
            assert complete_run(folder / "run"), "the run folder was lost with the console"


COLUMNS = st.sampled_from(["0", "1", "-3", "junk", "", " 80", "39", "40", "80", "100000"])


def width_case(columns: str, encoding: str, markdown: bool, which: int) -> None:
    summary = SUMMARIES[which % len(SUMMARIES)]
    verdict = json.loads(summary.read_text())["verdict"]
    code, out, err = forked_cli(["report", str(summary.parent), *(["--markdown"] if markdown else [])],
                                encoding=encoding, COLUMNS=columns)
    _tally("widths", code)
    check_outcome(code, out, err)
    assert code == (0 if verdict == "pass" else 1), (code, err)
    banner = f"## parity: {verdict.upper()}" if markdown else f"{verdict.upper()} "
    assert banner in out, f"COLUMNS={columns!r} {encoding}: no verdict line in {out[-500:]!r}"


# --- signals while a fresh interpreter starts -----------------------------------------------------------

def signal_case(signum: int, delay: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        proc = subprocess.Popen([sys.executable, "-m", "parity", *_run_tiny(folder, modes="eager")], cwd=folder,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        # NOTE: from the moment our handlers are in (parity/__main__.py; a caught SIGTERM says so): before it,
        # Python is still starting itself (site, encodings), which no code of ours can speak for.
        deadline = time.monotonic() + 60
        while not catches(proc.pid, signal.SIGTERM) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=300)
        _tally("signals", proc.returncode)
        expected = 130 if signum == signal.SIGINT else 143
        assert proc.returncode in (0, expected), (proc.returncode, err[-2000:])
        assert "Traceback" not in err and (proc.returncode == 0 or one_line(err)), err[-2000:]
        assert not (folder / "run").exists() or complete_run(folder / "run"), "a partial run folder"


# kind -> (strategies of the body's arguments, body, CI examples)
KINDS = {
    "options": ((st.sampled_from(sorted(OPTIONS)), option_values), option_case, 40),
    "configs": ((configs,), config_case, 25),
    "devices": ((st.sampled_from(READERS), st.sampled_from(SOURCES)), device_case, 15),
    "pipes": ((st.sampled_from(["run", "gate", "report"]), st.integers(0, 4), st.booleans()), pipe_case, 8),
    "widths": ((COLUMNS, st.sampled_from(["utf-8", "ascii", "latin-1"]), st.booleans(), st.integers(0, 3)),
               width_case, 10),
    "signals": ((st.sampled_from([signal.SIGINT, signal.SIGTERM]), st.floats(0.0, 4.0)), signal_case, 2),
}
