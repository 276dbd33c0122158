"""Every catalogued fault x every mode, through the same path `parity run` takes.

Where a fault shows on its home scenario, the run drifts and the diagnosis
names the fault's kind and buffers; everywhere else (eager, PIECEWISE for
attention-metadata faults, ...) nothing is flagged. The harness is told
nothing about which fault is active: it only sees engines built from the
scenario and the injected names.

The matrix runs twice: as shipped, and under the padding-numerics seam
(`--simulate-padding-numerics`), where every padded reference parts from eager.
There every fault must still be found and named, judged against the reference,
and every mode the fault does not reach passes with its numerics reported (the clean engine under the
seam, every graph mode parted from eager yet passing, is test_three_way_verdict's one run of it). Both
in fp32: in bf16 the graph pools lay out differently, and shared-pool-alias's
drafter temporaries then miss the live logits in full and full_decode_only (the
graphs are bitwise equal to their references there: nothing to find). The
seam's own temporaries move those placements too, so under it a pool alias is
judged where it shows.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from parity.faults.catalog import FAULTS
from parity.commands.matrix import run_matrix
from parity.graphs.modes import MODES

ROOT = Path(__file__).resolve().parent.parent
# NOTE: every slow test forks a `parity run` child; they inherit what the fixture loads.
pytestmark = pytest.mark.usefixtures("warm_forked_children")
GRAPH_MODES = [m for m in MODES if m != "eager"]


SEAM = ("--simulate-padding-numerics", "0.1")
VARIANTS = {"plain": (), "numerics": SEAM}
# The tensor-parallel faults need --tp 2: tests/test_tp.py and tests/test_tp_faults.py name each of them. The overlapped
# loop's faults are graded through parity run in tests/test_overlap_cli.py (costly: each diagnosis re-runs the
# mode a dozen times).
CELLS = [(variant, name) for variant in VARIANTS for name in FAULTS
         if FAULTS[name].tp == 1 and FAULTS[name].scenario != "overlap"]
# Faults whose home scenario costs more than make test's budget holds (the tree faults' scenarios; the hybrid
# faults' synth pair): make test-costly runs them, and tests/test_hybrid.py finds the hybrid ones in make test.
# block-table-stride-drift: tests/test_stride_drift.py names it at engine level in make test.
COSTLY = ("tree-padding-attends-live", "tree-buffer-without-topk", "block-table-stride-drift") + tuple(
    name for name, fault in FAULTS.items() if fault.scenario == "hybrid")


def _one_per_kind() -> set[str]:
    """The plain cells make test keeps: one fault per bug kind (its first on the default scenario, else its first),
    so every kind is found end to end before a commit; the kind's other faults are in make test-costly."""
    kept: dict[str, str] = {}
    for name, fault in sorted(FAULTS.items(), key=lambda item: item[1].scenario != "default"):
        if ("plain", name) in CELLS and name not in COSTLY:
            kept.setdefault(fault.kind, name)
    return set(kept.values())


KEPT = _one_per_kind()


def _costly(variant: str, name: str) -> bool:
    """In make test-costly (CI runs it after make test): the faults above, every cell under the numerics seam (the
    seam's own checks are in test_three_way_verdict) and the plain cells of a kind another fault stands for."""
    return variant != "plain" or name not in KEPT


def run_cell(variant: str, name: str) -> dict:
    """One fault on its home scenario in every mode: `parity run` in a child forked from this process."""
    return run_matrix("tiny-llama3-eagle", "emulated", names=[name], scenarios_dir=ROOT / "scenarios",
                      extra=VARIANTS[variant], jobs=1)[name]


@pytest.mark.slow
@pytest.mark.parametrize("variant,name", [pytest.param(v, n, marks=[pytest.mark.costly] if _costly(v, n) else [])
                                          for v, n in CELLS], ids=[f"{v}-{n}" for v, n in CELLS])
def test_fault_is_found_where_it_shows_and_nowhere_else(variant, name):
    fault = FAULTS[name]
    summary = run_cell(variant, name)
    seamed = variant == "numerics"
    # Pool aliasing shows where the allocator puts a drafter temporary on a live output. The seam's noise adds
    # [rows, vocab] temporaries to every logits step, which moves those placements: under it a POOL_ALIAS fault is
    # judged where it shows (named there, and it shows somewhere), not in the modes measured without the seam.
    placed = seamed and fault.kind == "POOL_ALIAS"
    assert summary["modes"]["eager"]["verdict"] == "pass"
    if placed:
        assert any(summary["modes"][mode]["verdict"] == "drift" for mode in GRAPH_MODES), name
    for mode in GRAPH_MODES:
        verdict = summary["modes"][mode]["verdict"]
        diagnosis = summary["diagnoses"].get(mode)
        if mode in fault.manifests_in and fault.kind == "NOT_EXERCISED":
            assert verdict == "not_exercised", f"{name} in {mode}: {verdict}"
        elif mode in fault.manifests_in and not (placed and verdict == "pass"):
            assert verdict == "drift", f"{name} did not show in {mode}"
            assert diagnosis is not None and diagnosis["kind"] == fault.kind, (mode, diagnosis)
            assert set(fault.buffers) <= set(diagnosis["buffers"]), (mode, diagnosis["buffers"])
            # Named only by an experiment that isolated it: the diagnosis says which.
            assert diagnosis["experiment"], (mode, diagnosis["evidence"])
            assert diagnosis["phase"] is not None
            # A capacity shortfall is found before capture and a capture error at capture, at no step; every other
            # kind at the step it showed.
            assert (diagnosis["step"] is None) == (fault.kind in ("SHORT_BUFFER", "CAPTURE_ERROR")), diagnosis
        else:
            assert verdict == "pass", f"{name} flagged in {mode}: {summary['modes'][mode]['reasons']}"
            assert diagnosis is None
            assert summary["modes"][mode]["reference"]["bitwise_equal"], (name, mode)
            if seamed:
                assert summary["modes"][mode]["numerics"] is not None, (name, mode)
    # The bisection stays within its replay budget.
    named_buffers = 8 + 16   # the target's and the drafter's registries
    budget = 2 * math.ceil(math.log2(named_buffers)) + 4
    for mode, diagnosis in summary["diagnoses"].items():
        assert diagnosis["replays"] <= budget, (mode, diagnosis["replays"])


def test_the_detector_never_reads_fault_switches():
    """The analysis may not look at which bugs an engine was built with."""
    for path in (ROOT / "parity" / "analysis").glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\bfaults?\b|FAULTS|catalog", text), f"{path.name} mentions the fault switches"
