"""Red team (issue 28): an RNG offset the draft forward advances itself, on eagle-parity's engine (FULL).

The drafter keys its sampler's random numbers with the drafted positions plus `self.rng_offset`, a Python
counter on the proposer that every draft forward (prefill and steps) moves on by one. A replay runs no
Python: the graph keeps the offset it was captured with. Truth (docs/bugs.md, issue 28 item 3):
FROZEN_AT_CAPTURE naming `rng_offset`, which the tool gives when a draft step is the first forward to part.
Here the graphed draft prefill parts first and the answer is UNEXPLAINED ("the reference's forward does not
reproduce its own outputs": the re-runs each advance the counter). On scenarios/s005-sampled-drafts.yaml the
FULL and PIECEWISE modes get PADDING_LEAK naming eight buffers (the padding probe's two runs move it too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from parity.engine.proposer import EagleProposer
from parity.harness.request import RunRequest
from parity.harness.session import run_session

PROMPTS = Path(__file__).resolve().parents[1] / "scenarios" / "prompts" / "default.jsonl"
SCENARIO = {"name": "rt-rng", "prompts": str(PROMPTS), "num_requests": 1, "arrivals": [0],
            "max_tokens": 3, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64,
            "num_speculative_tokens": 3, "temperature": 0.8, "seed": 5, "block_size": 16, "modes": ["eager", "full"]}


def sampling_positions(self, drafted_positions):
    self.rng_offset = getattr(self, "rng_offset", 0) + 1      # BUG: host state the forward advances itself
    return drafted_positions + self.rng_offset


@pytest.fixture(scope="module")
def diagnosis(tmp_path_factory):
    path = tmp_path_factory.mktemp("rt") / "rt.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EagleProposer, "sampling_positions", sampling_positions)
        outcome = run_session(RunRequest("tiny-llama3-eagle", str(path), ("eager", "full"), "emulated"))
    assert outcome.summary["modes"]["full"]["verdict"] == "drift"
    return outcome.summary["diagnoses"]["full"]


def test_the_counter_is_found(diagnosis):
    assert diagnosis["phase"] in ("draft_prefill", "draft_step"), diagnosis


def test_the_counter_is_named_frozen_at_capture(diagnosis):
    assert (diagnosis["kind"], diagnosis["buffers"]) == ("FROZEN_AT_CAPTURE", ["rng_offset"]), diagnosis["evidence"][:2]
