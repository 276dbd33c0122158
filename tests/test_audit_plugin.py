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

ROOT = Path(__file__).resolve().parents[1]
SUITE = "examples/audit_suite"


def _plugin_installed() -> bool:
    return any(ep.value.startswith("parity.audit.pytest_plugin") for ep in entry_points(group="pytest11"))


def run_suite(tmp_path: Path, bugs: str, audit: bool) -> tuple[subprocess.CompletedProcess, Path]:
    junit = tmp_path / f"junit-{bugs or 'clean'}-{audit}.xml"
    env = {**os.environ, "PARITY_AUDIT_EXAMPLE_BUGS": bugs,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-o", "addopts=", "-rf",
           f"--junitxml={junit}"]
    if not _plugin_installed():
        cmd += ["-p", "parity.audit.pytest_plugin"]
    if audit:
        cmd.append("--parity-audit")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600), junit


def test_planted_bug_fails_the_suite_with_the_panel(tmp_path):
    proc, junit = run_suite(tmp_path, "frozen", audit=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FROZEN_AT_CAPTURE" in proc.stdout and "╭─ parity.audit" in proc.stdout
    assert "self.draft_step" in proc.stdout and "2 failed" in proc.stdout
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    properties = {p.get("name"): p.get("value") for case in cases for p in case.iter("property")}
    diagnoses = json.loads(properties["parity_audit"])
    assert diagnoses[0]["kind"] == "FROZEN_AT_CAPTURE" and diagnoses[0]["buffers"] == ["self.draft_step"]


def test_clean_engine_passes(tmp_path):
    proc, _ = run_suite(tmp_path, "", audit=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "12 graph(s) audited, 0 diagnosis(es)" in proc.stdout
