"""Fuzzed hostile inputs (hypothesis): scenarios, prompt sets, vLLM files, summaries, baselines; and options,
checkpoint configs, devices and FIFOs, early-leaving readers, terminal widths, signals while starting
(fuzzenv.py).

Whatever the file holds, the CLI exits 0, 1 or 2 (2 in one line), prints no
traceback and leaves no partial run folder (fuzzkit.check_outcome). CI runs
a few dozen derandomized examples per kind (profile "parity-ci"); `make fuzz`
runs the same bodies for a bounded time with random examples (test_fuzz_soak.py).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import fuzzcases
import fuzzenv
from fuzzkit import PROFILE

KINDS = {**fuzzcases.KINDS, **fuzzenv.KINDS}


def _fuzz(kind: str):
    strategies, body, examples = KINDS[kind]

    @settings(PROFILE, max_examples=examples)
    @given(st.tuples(*strategies))
    def fuzzed(args):
        body(*args)
    fuzzed.__name__ = f"test_fuzzed_{kind}"
    return fuzzed


test_fuzzed_scenarios = _fuzz("scenario")
test_fuzzed_prompt_sets = _fuzz("prompts")
test_fuzzed_vllm_files = _fuzz("vllm")
test_fuzzed_summaries = _fuzz("summary")
test_fuzzed_baselines = _fuzz("baseline")
test_fuzzed_options = _fuzz("options")
test_fuzzed_checkpoint_configs = _fuzz("configs")
test_fuzzed_devices_and_fifos = _fuzz("devices")
test_fuzzed_pipes = _fuzz("pipes")
test_fuzzed_terminal_widths = _fuzz("widths")
test_fuzzed_signals_while_starting = _fuzz("signals")
