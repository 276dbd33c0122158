"""No false alarm over ten seeds of scenarios/hybrid.yaml, through the user's path (issue 34's must-show).

`parity run --model local` on a tiny synth hybrid pair (`parity models synth --head eagle1 --hybrid`, built once),
the scenario's five modes on the emulated backend, with sampled drafts (temperature 0.8) so that each seed draws
other tokens and other accept/reject patterns (rollbacks of the recurrent state): every mode must PASS, bitwise
equal to its padded reference with the padding probe over the state slots clean. overlap.yaml's ten seeds are in
tests/test_overlap_cli.py; both scenarios under the padding-numerics seam: `parity bench false-alarms`.

Marked `costly` (make test-costly, which CI runs after make test): ten whole runs of five modes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.commands.matrix import tiny_pair
from tests.robustkit import call

pytestmark = [pytest.mark.costly, pytest.mark.xdist_group("hybrid-cli")]

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "hybrid.yaml"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_pair("eagle1 --hybrid", tmp_path_factory.mktemp("hybrid-pair") / "pair")


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    text = SCENARIO.read_text().replace("temperature: 0.0", "temperature: 0.8")
    text = text.replace("prompts: prompts/", f"prompts: {SCENARIO.parent}/prompts/")
    path = tmp_path_factory.mktemp("hybrid-scenario") / "hybrid-sampled.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("seed", range(10))
def test_hybrid_scenario_passes_over_ten_seeds(tmp_path, pair, sampled, seed):
    target, draft = pair
    out = tmp_path / "run"
    code, _, err = call(["run", "--model", "local", "--target-path", str(target), "--draft-path", str(draft),
                         "--scenario", str(sampled), "--backend", "emulated", "--seed", str(seed), "--quiet",
                         "--out", str(out)])
    assert code in (0, 1), err
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["modes"]) == {"eager", "piecewise", "full", "full_decode_only", "full_and_piecewise"}
    assert summary["verdict"] == "pass", {m: (v["verdict"], v.get("reasons")) for m, v in summary["modes"].items()}
    for mode, verdict in summary["modes"].items():
        if mode != "eager":
            assert verdict["reference"]["bitwise_equal"], mode
