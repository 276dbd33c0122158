"""`pytest --parity-audit` on an engine's own test suite (examples/audit_suite), run in a subprocess.

The suite's tests only check that speculative output equals greedy output,
which a broken drafter does not change: they pass with the planted bug
(test_audit_second_engine shows the output is unchanged). With --parity-audit
the same suite fails, with the diagnosis panel in the report and the
diagnosis in the JUnit XML; the clean engine passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# NOTE: the module fixture is the expensive part: one xdist worker runs it once.
pytestmark = pytest.mark.xdist_group("audit_plugin")

ROOT = Path(__file__).resolve().parents[1]
SUITE = "examples/audit_suite"


def _plugin_installed() -> bool:
    return any(ep.value.startswith("parity.audit.pytest_plugin") for ep in entry_points(group="pytest11"))


def start_suite(tmp_path: Path, bugs: str, audit: bool) -> tuple[subprocess.Popen, Path, Path]:
    junit = tmp_path / f"junit-{bugs or 'clean'}-{audit}.xml"
    log = tmp_path / f"out-{bugs or 'clean'}-{audit}.txt"
    env = {**os.environ, "PARITY_AUDIT_EXAMPLE_BUGS": bugs,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-o", "addopts=", "-rf",
           f"--junitxml={junit}"]
    if not _plugin_installed():
        cmd += ["-p", "parity.audit.pytest_plugin"]
    if audit:
        cmd.append("--parity-audit")
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), junit, log


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both runs of the suite at once (they are independent processes): {bugs: (returncode, output, junit)}."""
    tmp_path = tmp_path_factory.mktemp("audit_suite")
    started = {bugs: start_suite(tmp_path, bugs, audit=True) for bugs in ("frozen", "")}
    return {bugs: (proc.wait(timeout=600), log.read_text(), junit) for bugs, (proc, junit, log) in started.items()}


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
