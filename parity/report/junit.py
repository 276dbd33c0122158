"""JUnit XML of a gate report: one test case per check (mode x position, length, parity).

Test cases are named `<subject> vs <reference>: <check>` under the class
`parity.gate.<scenario>`; a failed check carries its numbers in the failure
message, every check carries them in its system-out. Written atomically.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from parity.report.atomic import atomic_file


def _classname(report: dict, check: dict) -> str:
    scenario = (report.get("scenario") or "import").replace(".", "_")
    subject = str(check["subject"]).replace(".", "_")
    return f"parity.gate.{scenario}.{subject}"


def junit_tree(report: dict) -> ET.ElementTree:
    """The XML tree of a gate report (see the module docstring)."""
    result = report["result"]
    checks = result["checks"]
    failures = sum(1 for c in checks if not c["passed"])
    suites = ET.Element("testsuites", name="parity gate", tests=str(len(checks)), failures=str(failures),
                        errors="0")
    suite = ET.SubElement(suites, "testsuite", name=f"parity.gate.{report.get('scenario') or 'import'}",
                          tests=str(len(checks)), failures=str(failures), errors="0", skipped="0", time="0")
    props = ET.SubElement(suite, "properties")
    for key in ("model", "model_checksum", "scenario", "backend", "baseline"):
        if report.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=str(report[key]))
    for key in ("alpha", "correction", "family_size", "min_effect", "verdict"):
        ET.SubElement(props, "property", name=key, value=str(result[key]))
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=_classname(report, c),
                             name=f"{c['subject']} vs {c['reference']}: {c['name']}", time="0")
        if not c["passed"]:
            failure = ET.SubElement(case, "failure", message=c["message"], type="drift")
            failure.text = c["message"]
        out = ET.SubElement(case, "system-out")
        out.text = c["message"]
    if result.get("notes"):
        ET.SubElement(suite, "system-out").text = "\n".join(result["notes"])
    tree = ET.ElementTree(suites)
    ET.indent(tree)
    return tree


def write_junit(path: str | Path, report: dict) -> Path:
    """Write the JUnit XML of `report` to `path` (temp file in the same folder, then rename)."""
    with atomic_file(path, binary=True) as handle:
        junit_tree(report).write(handle, encoding="utf-8", xml_declaration=True)
    return Path(path)
