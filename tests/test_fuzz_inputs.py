"""Fuzzed hostile inputs (hypothesis): scenarios, prompt sets, vLLM files, summaries, baselines.

Whatever the file holds, the CLI exits 0, 1 or 2 (2 in one line), prints no
traceback and leaves no partial run folder (fuzzkit.check_outcome). CI runs
a few dozen derandomized examples per kind (profile "parity-ci"); `make fuzz`
runs the same bodies for a bounded time with random examples (test_fuzz_soak.py).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzcases import KINDS
from fuzzkit import PROFILE


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
