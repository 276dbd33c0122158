"""The three-way verdict: graph vs its padded reference (bitwise), reference vs eager (numerics, reported).

CPU kernels are batch-invariant here, so padding numerics are simulated with
the documented seam (`--simulate-padding-numerics`): padded forwards of graphs
and references move their logits by a function of the padded shape, eager
never. With it the clean engine must PASS in every mode while eager and the
references differ (greedy flips included); a real graph bug must still be a
DRIFT, judged against the reference, not against eager.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path

import pandas as pd
import pytest

from conftest import engine_config, make_specs
from parity.analysis.draft_parity import draft_parity
from parity.analysis.numerics import numerics
from parity.analysis.reference_parity import reference_parity
from parity.engine.parts import EngineParts
from parity.engine.spec_decode import SpecDecodeEngine
from parity.faults.seam import apply
from parity.harness.modes import yardstick
from parity.harness.request import RunRequest
from parity.harness.session import run_session
from parity.harness.simulated_numerics import simulate_padding_numerics
from parity.graphs.modes import MODES
from tests.robustkit import call, run_args

# NOTE: the module fixture is the expensive part: one xdist worker runs it once.
pytestmark = pytest.mark.xdist_group("three_way_verdict")
ROOT = Path(__file__).resolve().parent.parent

SCALE = 0.1


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The clean engine on the default scenario in every mode under the seam, through `parity run` itself: its
    exit code and the summary it saved (the one run of it in the suite; the mutation matrix's seam cells lean
    on it)."""
    out = tmp_path_factory.mktemp("seamed") / "run"
    code, text, _ = call(run_args(ROOT / "scenarios" / "default.yaml", "--simulate-padding-numerics", str(SCALE),
                                  "--out", str(out), modes=",".join(MODES)))
    return types.SimpleNamespace(code=code, text=text, out=out,
                                 summary=json.loads((out / "summary.json").read_text()))


def test_clean_engine_passes_every_mode_while_numerics_are_reported(simulated):
    """Also: under the seam every padded reference parts from eager (the NUMERICS the verdict must not be fooled
    by) while every graph mode passes against its reference, and `parity run` exits 0."""
    summary = simulated.summary
    assert simulated.code == 0
    assert summary["verdict"] == "pass", [m["reasons"] for m in summary["modes"].values()]
    graph_modes = [m for m in summary["modes"] if m != "eager"]
    assert len(graph_modes) == 4
    for mode in graph_modes:
        m = summary["modes"][mode]
        assert m["reference"]["bitwise_equal"] and m["reference"]["first_difference"] is None
        assert m["reference"]["rows_compared"] > 0
        assert m["numerics"]["max_abs_logprob_diff"] > 0, f"{mode}: the seam must move the reference"
    flips = sum(summary["modes"][m]["numerics"]["token_flips"] for m in graph_modes)
    assert flips > 0, "the seam must flip at least one greedy token somewhere"
    assert not all(summary["modes"][m]["tokens_equal_to_eager"] for m in graph_modes)
    assert summary["schema_version"] == 2
    assert set(summary["references"]) == {"ref:piecewise", "ref:full", "ref:full_decode_only"}
    assert summary["references"]["ref:full"]["modes"] == ["full", "full_and_piecewise"]


def test_every_flip_is_explained_by_a_near_tie(simulated):
    for mode, m in simulated.summary["modes"].items():
        n = m["numerics"]
        if n is not None:
            assert n["near_ties"] == n["token_flips"] + n["draft_flips"], (mode, n["flips"])


def test_the_seam_never_touches_eager(random_pair):
    specs = make_specs(4, seed=3, max_tokens=8, max_prompt=12, stagger=1)
    cfg = engine_config(max_num_seqs=2, max_num_batched_tokens=32, block_size=4)
    plain = SpecDecodeEngine(*random_pair, cfg).run(specs)
    seamed = SpecDecodeEngine(*random_pair, cfg, parts=simulate_padding_numerics(EngineParts(), 5.0)).run(specs)
    assert reference_parity(seamed, plain, "eager").bitwise_equal


def test_the_yardstick_widens_by_the_scale_the_seam_declares(random_pair):
    pair = types.SimpleNamespace(target=random_pair[0])
    assert yardstick(pair, EngineParts()).seam_scale == 0.0
    seamed = yardstick(pair, simulate_padding_numerics(EngineParts(), SCALE))
    assert seamed.seam_scale == SCALE and seamed.bound == seamed.dtype_bound + 2 * SCALE


def test_a_graph_bug_under_numerics_is_judged_against_the_reference(tmp_path):
    parts, policy = apply(["reassign-seq-lens"])
    request = RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "piecewise", "full"), "emulated",
                         parts=simulate_padding_numerics(parts, SCALE), policy=policy)
    summary = run_session(request).summary
    assert summary["modes"]["piecewise"]["verdict"] == "pass"          # attention reads live metadata there
    full = summary["modes"]["full"]
    assert full["verdict"] == "drift" and not full["reference"]["bitwise_equal"]
    assert "differs from its padded reference (ref:full)" in full["reasons"][0]
    assert summary["diagnosis"]["kind"] == "BUFFER_REASSIGNED" and summary["diagnosis"]["buffers"] == ["seq_lens"]


def test_padding_that_is_not_inert_is_a_drift_even_when_graph_and_reference_agree_on_clean_padding():
    parts, policy = apply(["padded-rows-unmasked"])
    request = RunRequest("tiny-llama3-eagle", "scenarios/default.yaml", ("eager", "full"), "emulated",
                         parts=parts, policy=policy, bisect=False)
    full = run_session(request).summary["modes"]["full"]
    assert full["verdict"] == "drift"
    assert full["reference"]["padding"] == {"inert": False, "graph_equals_clean_reference": True}
    assert any("padding is not inert" in r for r in full["reasons"])


def test_cli_summary_and_console_show_the_three_way_verdict(simulated):
    assert simulated.code == 0
    text = simulated.text
    assert "NUMERICS: padded reference vs eager (judged by a fixed bound)" in text
    assert "ref=" in text and "bitwise" in text
    full = json.loads((simulated.out / "summary.json").read_text())["modes"]["full"]
    assert {"bitwise_equal", "first_difference", "name"} <= set(full["reference"])
    assert {"max_abs_logprob_diff", "draft_flips", "near_ties", "token_flips"} <= set(full["numerics"])
    records = pd.read_parquet(simulated.out / "records.parquet")
    assert set(records["mode"]) == {*MODES, "ref:piecewise", "ref:full", "ref:full_decode_only"}


# --- the comparisons themselves ------------------------------------------------------------------

def _tokens(rows):
    return pd.DataFrame(rows, columns=["req_id", "step", "output_index", "position", "token", "logprob", "top2_gap"])


def _result(tokens, drafts=None):
    drafts = drafts if drafts is not None else pd.DataFrame(columns=[
        "step", "req_id", "draft_index", "position", "draft_token", "draft_logprob", "draft_top2_gap", "target_token",
        "target_logprob", "top5_tokens", "top5_logprobs", "accepted", "num_accepted"])
    return dataclasses.make_dataclass("R", ["tokens", "drafts"])(tokens, drafts)


def test_one_bit_of_a_logprob_is_a_difference():
    base = _tokens([(0, 0, 0, 5, 11, -0.5, 1.0), (0, 1, 1, 6, 12, -0.25, 1.0)])
    nudged = base.copy()
    nudged.loc[1, "logprob"] = math.nextafter(-0.25, 0.0)      # one bit
    verdict = reference_parity(_result(nudged), _result(base), "ref")
    assert not verdict.bitwise_equal
    assert verdict.first_difference["field"] == "logprob" and verdict.first_difference["step"] == 1
    assert reference_parity(_result(base), _result(base.copy()), "ref").bitwise_equal


def test_a_row_missing_on_one_side_is_a_difference_at_its_step():
    base = _tokens([(0, 0, 0, 5, 11, -0.5, 1.0), (0, 3, 1, 6, 12, -0.25, 1.0)])
    verdict = reference_parity(_result(base.iloc[:1]), _result(base), "ref")
    assert not verdict.bitwise_equal and verdict.first_difference["step"] == 3
    assert "missing in the mode run" in verdict.first_difference["field"]


def test_drafts_after_the_streams_part_are_not_compared():
    def drafts(tokens):
        return pd.DataFrame([{"step": s, "req_id": 0, "draft_index": 0, "position": p, "draft_token": t,
                              "draft_logprob": -0.1, "target_logprob": -0.2, "draft_top2_gap": 0.5}
                             for s, (p, t) in enumerate(tokens)])
    eager, other = drafts([(10, 1), (11, 2), (12, 3)]), drafts([(10, 1), (11, 9), (12, 9)])
    assert draft_parity(eager, other).mismatches == 2
    assert draft_parity(eager, other, split_at={0: 11}).mismatches == 1    # position 12 saw another context


def test_a_flip_far_from_a_tie_is_not_called_a_near_tie():
    """The near-tie rule reads the fixed bound, never the moves observed."""
    eager = _tokens([(0, 0, 0, 5, 11, -0.01, 3.0), (0, 1, 1, 6, 12, -0.2, 0.001)])
    ref = _tokens([(0, 0, 0, 5, 11, -0.0105, 3.0), (0, 1, 1, 6, 13, -0.2, 0.001)])
    n = numerics(_result(ref), _result(eager), "ref", bound=0.01)
    assert n.token_flips == 1 and n.max_abs_logprob_diff == pytest.approx(0.0005)
    assert n.near_ties == 1 and not n.beyond_bound        # gap 0.001 <= the bound 0.01
    far = _tokens([(0, 0, 0, 5, 11, -0.01, 3.0), (0, 1, 1, 6, 12, -0.2, 0.5)])
    assert numerics(_result(ref), _result(far), "ref", bound=0.01).near_ties == 0


def test_a_departure_beyond_the_bound_is_not_numerics_however_large_the_moves():
    """A shared padding bug moves logprobs a lot: the old rule (twice the largest move) called every flip a near
    tie; with a fixed bound the flip is no tie and the departure itself is beyond the bound."""
    eager = _tokens([(0, 0, 0, 5, 11, -0.01, 3.0), (0, 1, 1, 6, 12, -0.2, 0.9)])
    ref = _tokens([(0, 0, 0, 5, 11, -1.26, 3.0), (0, 1, 1, 6, 13, -0.2, 0.9)])
    n = numerics(_result(ref), _result(eager), "ref", bound=0.25)
    assert n.max_abs_logprob_diff == pytest.approx(1.25) and n.beyond_bound
    assert n.near_ties == 0
