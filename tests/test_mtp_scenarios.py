"""The MTP scenarios PASS in all five modes through `parity run` (the user's path) on tiny synth pairs of each
head, graphs bitwise equal to their padded references, acceptance reported per position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mtp_pairs import synth_pair
from tests.robustkit import call, run_args

ROOT = Path(__file__).resolve().parent.parent
CASES = [("mtp-deepseek", "mtp-deepseek"), ("mtp-deepseek", "mtp-qwen3next"),
         ("mtp-multilayer", "mtp-deepseek --mtp-layers 3"), ("mtp-multilayer", "mtp-qwen3next --mtp-layers 3")]


@pytest.mark.slow
@pytest.mark.parametrize("scenario,head", CASES, ids=[f"{s}-{h.split()[0]}" for s, h in CASES])
def test_mtp_scenario_passes_in_every_mode(tmp_path, scenario, head):
    target, draft = synth_pair(head)
    code, out, err = call(run_args(ROOT / "scenarios" / f"{scenario}.yaml", "--model", "local", "--target-path",
                                   str(target), "--draft-path", str(draft), "--out", str(tmp_path / "run"),
                                   modes="all"))
    assert code == 0, err[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["modes"]) == {"eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"}
    rates = summary["modes"]["eager"]["acceptance_per_position"]
    assert len(rates) == 3 and rates[0] >= 0.7 and rates[-1] >= 0.5 * rates[0], rates
    for mode, run in summary["modes"].items():
        assert run["verdict"] == "pass" and len(run["acceptance_per_position"]) == 3, mode
        if mode != "eager":
            assert run["reference"]["bitwise_equal"], mode
