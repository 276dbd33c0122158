"""The fuzzed input kinds: for each, a strategy of hostile files and a body that feeds one to the CLI.

Every body calls `parity.cli.main` in this process (no interpreter start-up)
and checks the outcome with fuzzkit.check_outcome. Engine runs are kept
cheap: most mutated scenarios are refused before a model loads; a valid one
runs only when it is tiny (`cheap`), otherwise the engine call answers
"(fuzz) too large" as a ParityInputError, so a valid but huge scenario is
still parsed, resolved and its model loaded, but never run for minutes. The
gate's engine runs are memoised (the same scenario gives the same runs), so
baseline fuzzing costs no engine time after the first example.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st
from transformers.utils import logging as hf_logging

import parity.harness.gate as gate_harness
import parity.harness.session as session
from fuzzkit import (NASTY_NUMBERS, SUMMARIES, TINY, VALUES, VLLM_FILES, check_outcome, corrupted, dump_yaml,
                     mutated, tiny_yaml_data, yaml_bomb)
from parity.errors import ParityInputError
from parity.graphs.modes import MODES, default_capture_sizes
from robustkit import call, tiny_scenario

COUNTS: collections.Counter = collections.Counter()        # examples tried per kind
OUTCOMES: collections.Counter = collections.Counter()      # (kind, exit code or "too large")
TOO_LARGE = "(fuzz) a valid scenario too large to run in a test"


def cheap(scenario, modes) -> bool:
    """A scenario whose engine runs take well under a second a mode on one CPU thread."""
    graphs = len(modes) > 1
    sizes = scenario.capture_sizes or default_capture_sizes(scenario.max_num_batched_tokens)
    return (scenario.num_requests * (scenario.max_tokens + 1) <= 32 and scenario.max_model_len <= 2048
            and scenario.max_num_batched_tokens <= 512 and scenario.max_num_seqs <= 8 and len(modes) <= 3
            and max(scenario.arrivals) <= 1000 and (not graphs or len(sizes) <= 6) and max(sizes) <= 512)


@contextlib.contextmanager
def cheap_engine():
    """Engine runs only for cheap scenarios; the gate's runs memoised per (scenario, seed, modes)."""
    run_modes, gate_run_modes = session.run_modes, gate_harness.run_modes

    def guarded(pair, scenario, modes, *args, **kwargs):
        if not cheap(scenario, modes):
            raise ParityInputError(TOO_LARGE)
        return run_modes(pair, scenario, modes, *args, **kwargs)

    session.run_modes, gate_harness.run_modes = guarded, _memo(guarded)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()     # a 40000-token prompt makes the tokenizer warn once per example
    try:
        yield
    finally:
        session.run_modes, gate_harness.run_modes = run_modes, gate_run_modes
        hf_logging.set_verbosity(verbosity)


_RUNS: dict = {}


def _memo(run):
    @functools.wraps(run)
    def memo(pair, scenario, modes, *args, **kwargs):
        key = (scenario.path, scenario.seed, tuple(modes))
        if key not in _RUNS:
            _RUNS[key] = run(pair, scenario, modes, *args, **kwargs)
        return _RUNS[key]
    return memo


_TRACEBACKS = tempfile.mkdtemp(prefix="parity-fuzz-tracebacks-")    # exit 3 saves one; gone at exit
atexit.register(shutil.rmtree, _TRACEBACKS, True)


def feed(kind: str, argv: list[str], out_dir: Path | None = None) -> None:
    """Run the CLI on one fuzzed input, check the rule, count the example and its outcome."""
    previous, tempfile.tempdir = tempfile.tempdir, _TRACEBACKS
    try:
        with cheap_engine():
            code, out, err = call(argv)
    finally:
        tempfile.tempdir = previous
    COUNTS[kind] += 1
    OUTCOMES[(kind, "too large" if TOO_LARGE in err else code)] += 1
    if TOO_LARGE not in err:
        check_outcome(code, out, err, out_dir)


# --- scenario YAML ------------------------------------------------------------------------------------

SCENARIO_BASE = tiny_yaml_data(modes=["eager", "full"])
scenarios = st.one_of(
    mutated(SCENARIO_BASE).map(lambda d: dump_yaml(d).encode()),
    st.deferred(lambda: plausible_scenarios()),
    mutated(SCENARIO_BASE).map(dump_yaml).flatmap(corrupted),
    st.integers(1, 12).map(lambda depth: yaml_bomb(depth).encode()),
    st.binary(max_size=256),
)


@st.composite
def plausible_scenarios(draw) -> bytes:
    """Scenarios inside the accepted ranges (most run the engine): odd but legal engine shapes."""
    n = draw(st.integers(1, 3))
    pick = {
        "num_speculative_tokens": st.integers(1, 8), "block_size": st.integers(1, 32),
        "max_model_len": st.integers(8, 160), "max_num_seqs": st.integers(1, 3),
        "max_num_batched_tokens": st.integers(4, 96), "max_tokens": st.integers(1, 8),
        "arrivals": st.one_of(st.just([0]), st.lists(st.integers(0, 3), min_size=n, max_size=n),
                              st.builds(lambda every: {"every": every}, st.integers(0, 2))),
        "temperature": st.sampled_from([0.0, 1e-6, 0.5, 1.0, 2.0, 100.0]),
        "capture_sizes": st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True).map(sorted),
        "modes": st.lists(st.sampled_from(MODES), min_size=1, max_size=2, unique=True),
        "drafter_mode": st.sampled_from(MODES), "shared_drafter_pool": st.booleans(),
        "sliding_window": st.builds(lambda size, layers: {"size": size, "layers": layers}, st.integers(1, 16),
                                    st.lists(st.integers(0, 2), max_size=2)),
        "seed": st.integers(0, (1 << 63) - 1),
    }
    data = tiny_yaml_data(num_requests=n, max_num_batched_tokens=64)
    for key, strategy in pick.items():
        if draw(st.booleans()):
            data[key] = draw(strategy)
    return dump_yaml(data).encode()


def scenario_case(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "scenario.yaml", Path(tmp) / "run"
        path.write_bytes(raw)
        feed("scenario", ["run", "--scenario", str(path), "--backend", "emulated", "--quiet", "--no-bisect",
                          "--out", str(out)], out)


# --- prompt sets (JSONL) ----------------------------------------------------------------------------

_LINES = st.one_of(
    st.builds(lambda t: json.dumps({"id": "p", "text": t}), st.text(max_size=80)),
    st.builds(lambda t: json.dumps({"text": t}, ensure_ascii=False), st.text(max_size=80)),
    st.just('{"text": "the turtle looked worried ."}'), st.just(""), st.just("   "), st.just("not json"),
    st.just('{"text": "\\ud800 lone surrogate"}'), st.just('{"id": 1, "text": 5}'), st.just('{"txt": "x"}'),
    st.just('{"text": "' + "the turtle " * 20000 + '"}'), st.just('{"text": ""}'), st.just('{"text": "\\u0000"}'),
    VALUES.map(lambda v: json.dumps(v, default=str)),
)
_PROMPT_TEXTS = st.tuples(st.lists(_LINES, max_size=6), st.sampled_from(["\n", "\r\n"])).map(
    lambda lines_sep: lines_sep[1].join(lines_sep[0]))
prompt_files = st.one_of(_PROMPT_TEXTS.map(str.encode), _PROMPT_TEXTS.flatmap(corrupted))


def prompts_case(raw: bytes, num_requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        prompts, out = Path(tmp) / "prompts.jsonl", Path(tmp) / "run"
        prompts.write_bytes(raw)
        scenario = tiny_scenario(Path(tmp), prompts=str(prompts), num_requests=num_requests, modes=["eager"])
        feed("prompts", ["run", "--scenario", str(scenario), "--backend", "emulated", "--quiet", "--no-bisect",
                         "--out", str(out)], out)


# --- vLLM metrics and printed output --------------------------------------------------------------------

@st.composite
def vllm_texts(draw) -> bytes:
    lines = draw(st.sampled_from(VLLM_FILES)).read_text().splitlines()
    for _ in range(draw(st.integers(0, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["delete", "duplicate", "number", "mix", "swap"]))
        if edit == "delete":
            del lines[i]
        elif edit == "duplicate":
            lines.insert(i, lines[i])
        elif edit == "number":
            words = lines[i].rsplit(maxsplit=1) or [""]
            value = draw(st.one_of(NASTY_NUMBERS.map(str), st.sampled_from(["NaN", "-Inf", "+Inf", "-1", "1e400"])))
            lines[i] = f"{words[0]} {value}" if len(words) > 1 else value
        elif edit == "mix":
            lines.insert(i, draw(st.sampled_from(draw(st.sampled_from(VLLM_FILES)).read_text().splitlines())))
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return draw(corrupted("\n".join(lines) + draw(st.sampled_from(["\n", ""]))))


def vllm_case(raw: bytes, variant: int, num_drafts: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.prom"
        path.write_bytes(raw)
        good = str(VLLM_FILES[variant % len(VLLM_FILES)])
        argv = [["import", str(path)], ["import", str(path), "--json"],
                ["import", str(path), "--format", "prometheus"], ["import", str(path), "--format", "text"],
                ["gate", "--import", good, "--import", str(path)],
                ["gate", "--import", str(path), "--import", good, "--num-drafts", str(num_drafts)]][variant % 6]
        feed("vllm", argv)


# --- summary.json (parity report DIR) ------------------------------------------------------------------

summaries = st.sampled_from(SUMMARIES).flatmap(
    lambda path: mutated(json.loads(path.read_text()))).map(lambda data: json.dumps(data, default=str)).flatmap(
    lambda text: st.one_of(st.just(text.encode()), corrupted(text)))


def summary_case(raw: bytes, markdown: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "run").mkdir()
        (Path(tmp) / "run" / "summary.json").write_bytes(raw)
        feed("summary", ["report", str(Path(tmp) / "run")] + (["--markdown"] if markdown else []))


# --- baselines (parity gate --baseline) ---------------------------------------------------------------

_BASELINE: dict = {}


def baseline_setup() -> tuple[Path, dict]:
    """A tiny scenario in a folder that lives as long as the process, and a baseline written for it."""
    if not _BASELINE:
        folder = Path(tempfile.mkdtemp(prefix="parity-fuzz-baseline-"))
        atexit.register(shutil.rmtree, folder, True)
        scenario = tiny_scenario(folder, modes=["eager", "full"])
        with cheap_engine():
            code, _, err = call(["gate", "--scenario", str(scenario), "--backend", "emulated", "--modes",
                                 "eager,full", "--update-baseline", "--baseline", str(folder / "base.json")])
        assert code == 0, err
        _BASELINE.update(scenario=scenario, data=json.loads((folder / "base.json").read_text()))
    return _BASELINE["scenario"], _BASELINE["data"]


def baselines():
    return st.builds(lambda: baseline_setup()[1]).flatmap(mutated).map(
        lambda data: json.dumps(data, default=str)).flatmap(lambda text: st.one_of(st.just(text.encode()),
                                                                                   corrupted(text)))


def baseline_case(raw: bytes) -> None:
    scenario, _ = baseline_setup()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline.json"
        path.write_bytes(raw)
        feed("baseline", ["gate", "--scenario", str(scenario), "--backend", "emulated", "--modes", "eager,full",
                          "--baseline", str(path)])


# kind -> (strategies of the body's arguments, body, CI examples)
KINDS = {
    "scenario": ((scenarios,), scenario_case, 60),
    "prompts": ((prompt_files, st.integers(1, 2)), prompts_case, 25),
    "vllm": ((vllm_texts(), st.integers(0, 5), st.integers(1, 10 ** 6)), vllm_case, 80),
    "summary": ((summaries, st.booleans()), summary_case, 50),
    "baseline": ((baselines(),), baseline_case, 100),
}
assert set(TINY) <= set(SCENARIO_BASE)
