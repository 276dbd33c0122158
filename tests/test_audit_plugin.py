"""`pytest --parity-audit` on an engine's own test suite (examples/audit_suite), run in a forked child.

The suite's tests only check that speculative output equals greedy output,
which a broken drafter does not change: they pass with the planted bug
(test_audit_second_engine shows the output is unchanged). With --parity-audit
the same suite fails, with the diagnosis panel in the report and the
diagnosis in the JUnit XML; the clean engine passes.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from forked_pytest import pytest_in_fork

# NOTE: the module fixture is the expensive part: one xdist worker runs it once.
pytestmark = pytest.mark.xdist_group("audit_plugin")

ROOT = Path(__file__).resolve().parents[1]
SUITE = "examples/audit_suite"


def _plugin_installed() -> bool:
    return any(ep.value.startswith("parity.audit.pytest_plugin") for ep in entry_points(group="pytest11"))


def run_suite(tmp_path: Path, bugs: str) -> tuple[int, str, Path]:
    """`pytest examples/audit_suite --parity-audit` in a forked child: (exit code, output, JUnit XML)."""
    junit = tmp_path / f"junit-{bugs or 'clean'}.xml"
    args = [SUITE, "-rf", f"--junitxml={junit}", "--parity-audit"]
    if not _plugin_installed():
        args += ["-p", "parity.audit.pytest_plugin"]
    code, output = pytest_in_fork(args, tmp_path / f"out-{bugs or 'clean'}.txt", cwd=ROOT,
                                  env={"PARITY_AUDIT_EXAMPLE_BUGS": bugs})
    return code, output, junit


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The suite with the planted bug and without it, one after the other: {bugs: (exit code, output, junit)}."""
    tmp_path = tmp_path_factory.mktemp("audit_suite")
    return {bugs: run_suite(tmp_path, bugs) for bugs in ("frozen", "")}


def test_planted_bug_fails_the_suite_with_the_panel(runs):
    returncode, output, junit = runs["frozen"]
    assert returncode == 1, output[-3000:]
    assert "FROZEN_AT_CAPTURE" in output and "╭─ diagnosis" in output
    assert "self.draft_step" in output and "2 failed" in output
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    properties = {p.get("name"): p.get("value") for case in cases for p in case.iter("property")}
    diagnoses = json.loads(properties["parity_audit"])
    assert diagnoses[0]["kind"] == "FROZEN_AT_CAPTURE" and diagnoses[0]["buffers"] == ["self.draft_step"]


def test_clean_engine_passes(runs):
    returncode, output, _ = runs[""]
    assert returncode == 0, output[-3000:]
    assert "12 graph(s) audited, 0 diagnosis(es)" in output
