"""The second bug corpus (tests/bugs/, docs/bugs.md): patches the bisector was not built with.

Fast checks: every bug's metadata is valid, its patch touches only parity/engine,
parity/graphs or parity/models (tests/second_engine for `engine: second`) and
still applies to this tree (an expected source line where the patch puts it),
and the grading rules hold on hand-made summaries and audit errors. The slow tests grade each bug the way `make bugs` does
(emulated backend), one test a bug, and require its expected grade: NAMED,
CLEAN or CAUGHT. A bug marked `known_gap` (what the tool says of it today) is a
strict expected failure: once the tool gets it right, the mark must go.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# NOTE: every slow test forks a `parity run` child; they inherit what the fixture loads.
pytestmark = pytest.mark.usefixtures("warm_forked_children")
GRADER = ROOT / "tests" / "bugs" / "grade.py"


def _load_grader():
    spec = importlib.util.spec_from_file_location("bug_corpus_grade", GRADER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


grade = _load_grader()
BUGS = grade.load_corpus()
# Grading a bug is a whole run of the patched tree (and its bisection): every grade is in make test-costly, which CI
# runs after make test; make test keeps that every patch still applies (test_patch_applies_to_this_tree).
CASES = [pytest.param(b, id=b.id, marks=([pytest.mark.xfail(strict=True, reason=f"known gap: {b.known_gap}")]
                                         if b.known_gap else []) + [pytest.mark.costly])
         for b in BUGS]


def test_corpus_has_the_promised_shape():
    classes = [b.cls for b in BUGS]
    assert classes.count("graph") >= 15 and classes.count("refactor") >= 3 and classes.count("eager") >= 2
    scenarios = {p.stem for p in (ROOT / "scenarios").glob("*.yaml")}
    assert {b.scenario for b in BUGS if b.engine == "harness"} <= scenarios
    second = [b for b in BUGS if b.engine == "second"]
    assert sum(b.cls == "graph" for b in second) >= 4 and any(b.cls == "refactor" for b in second)
    for bug in BUGS:
        if bug.cls == "eager":
            assert (ROOT / "scenarios" / "baselines" / f"{bug.scenario}.json").is_file(), bug.id


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_patch_applies_to_this_tree(bug, tmp_path):
    done = subprocess.run(["git", "apply", "--check", str(bug.patch)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{bug.patch.name} no longer applies: {done.stderr.strip()}"
    # An expected source line (CAPTURE_ERROR's "path:N") must be a line the patch adds, where it lands in this tree:
    # an edit above it moves it, and the grade would call the right answer WRONG.
    lines = [(path, int(n)) for path, n in (b.rsplit(":", 1) for b in bug.buffers if re.fullmatch(r"\S+\.py:\d+", b))]
    if lines:
        for path in {path for path, _ in lines}:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text((ROOT / path).read_text())
        subprocess.run(["git", "apply", str(bug.patch)], cwd=tmp_path, check=True, capture_output=True)
        added = {line[1:].strip() for line in bug.patch.read_text().splitlines()
                 if line.startswith("+") and not line.startswith("+++")}
        for path, n in lines:
            landed = (tmp_path / path).read_text().splitlines()[n - 1].strip()
            assert landed in added, f"{bug.id}: line {n} of the patched {path} is {landed!r}, not a line it adds"


def _summary(verdicts: dict, diagnoses: dict) -> dict:
    return {"modes": {m: {"verdict": v} for m, v in verdicts.items()}, "diagnoses": diagnoses}


def test_grading_rules():
    bug = grade.Bug("b", "graph", "", "", "default", ["full"], ["piecewise"], kind="STALE_BUFFER",
                    buffers=["seq_lens"], may_also_name=["slot_mapping"])
    right = {"kind": "STALE_BUFFER", "buffers": ["seq_lens", "slot_mapping"], "step": 0, "phase": "verify"}
    assert grade.grade_graph(bug, _summary({"full": "drift", "piecewise": "pass"}, {"full": right}))[0] == "NAMED"
    other = dict(right, buffers=["seq_lens", "positions"])
    assert grade.grade_graph(bug, _summary({"full": "drift", "piecewise": "pass"}, {"full": other}))[0] == "WRONG"
    unknown = {"kind": "UNKNOWN", "buffers": [], "step": 3, "phase": "draft_step"}
    assert grade.grade_graph(bug, _summary({"full": "drift", "piecewise": "pass"}, {"full": unknown}))[0] == "LOCALISED"
    assert grade.grade_graph(bug, _summary({"full": "drift", "piecewise": "pass"}, {}))[0] == "UNDIAGNOSED"
    assert grade.grade_graph(bug, _summary({"full": "pass", "piecewise": "pass"}, {}))[0] == "MISSED"
    both = _summary({"full": "drift", "piecewise": "drift"}, {"full": right, "piecewise": right})
    assert grade.grade_graph(bug, both)[0] == "FALSE ALARM"
    from tests.bugs.report import totals

    errors = [{"class": "graph", "grade": "ERROR", "known_gap": gap} for gap in (None, "exits 3")]
    assert totals(errors)["failures"] == 1, "a known gap's grade is reported, not fatal"


def test_second_engine_grading_rules():
    from tests.bugs import second

    bug = grade.Bug("b", "graph", "", "", "", [], kind="BUFFER_REASSIGNED", buffers=["self.cache"],
                    may_also_name=["self.rows"], engine="second")
    named = {"kind": "BUFFER_REASSIGNED", "buffers": ["self.cache[0].k", "self.cache[1].v"], "owner": "g"}
    assert second.grade_error(bug, named) == "NAMED"
    assert second.grade_error(bug, dict(named, buffers=["self.cache[0].k", "self.rows"])) == "NAMED"
    assert second.grade_error(bug, dict(named, buffers=["self.cached"])) == "WRONG"
    assert second.grade_error(bug, dict(named, buffers=["self.cache.k", "self.tokens"])) == "WRONG"
    assert second.grade_error(bug, dict(named, kind="STALE_BUFFER")) == "WRONG"
    assert second.grade_error(bug, {"kind": "UNEXPLAINED", "buffers": [], "owner": "g"}) == "LOCALISED"
    assert second.grade_error(bug, {"kind": "UNEXPLAINED", "buffers": [], "owner": None}) == "UNDIAGNOSED"
    views = second.per_graph({"graphs": ["g", "h"], "errors": [named, dict(named, kind="STALE_BUFFER")]})
    assert views == {"g": {"verdict": "drift", **named}, "h": {"verdict": "pass"}}


@pytest.mark.slow
@pytest.mark.parametrize("bug", CASES)
def test_bug_gets_its_expected_grade(bug):
    """The bug graded the way `make bugs` grades it (emulated backend; the patched tree imported into a child
    forked from this process): a graph bug NAMED, a refactor CLEAN, an eager bug CAUGHT by the gate. A bug the
    diagnoser only localises, or names wrongly, fails here (an expected failure while it is a known gap)."""
    [result] = grade.grade_bugs([bug], ROOT, "emulated", jobs=1, timeout=300)
    expected = bug.expected_grade
    assert result["grade"] == expected, f"{bug.id}: {result['grade']} ({result['found']})\n" \
        + json.dumps(result.get("per_mode") or result.get("output"), indent=1, default=str)[-3000:]
