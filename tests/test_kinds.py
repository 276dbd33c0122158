"""The one table of kinds: every kind the code can emit has a meaning, and the docs say what it is.

Kinds are emitted through `Diagnosis` (which refuses a kind the table lacks)
or `parity.audit`'s `make_diagnosis` (the audit's own subset); the catalog
expects them. The code names them by the constants of parity/diagnosis/kinds.py
(a string where a kind goes is read too), so the kinds the code can emit are
the constants it imports and the strings it passes: each must be in the table,
have a meaning, and be explained in docs/bugs.md ("Which kind a bug is") or
docs/audit.md's table of kinds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from parity.audit.diagnosis import KINDS as AUDIT_KINDS
from parity.audit.diagnosis import make_diagnosis
from parity.diagnosis import kinds
from parity.diagnosis.kinds import MEANING
from parity.diagnosis.record import DIAGNOSIS_KEYS, Diagnosis
from parity.faults.catalog import FAULTS

ROOT = Path(__file__).resolve().parent.parent
KIND_CALLS = {"Diagnosis", "make_diagnosis", "_diagnosis", "diagnosis", "Experiment"}   # a kind is their first argument
TABLE_NAMES = {"MEANING", "BUG_KINDS", "WARNING_KINDS", "NAMED"}


def _kind_argument(call: ast.Call):
    named = [k.value for k in call.keywords if k.arg == "kind"]
    return named[0] if named else (call.args[0] if call.args else None)


def kinds_the_code_names() -> dict[str, str]:
    """{kind: where} for every kinds constant imported and every string passed where a kind goes, in parity/."""
    found = {}
    for path in (ROOT / "parity").rglob("*.py"):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "parity.diagnosis.kinds":
                found.update({a.name: where for a in node.names if a.name not in TABLE_NAMES})
            elif isinstance(node, ast.Call):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                arg = _kind_argument(node) if func in KIND_CALLS else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found[arg.value] = f"{where}:{node.lineno}"
    return found


def documented_kinds() -> set[str]:
    bugs = (ROOT / "docs" / "bugs.md").read_text()
    section = bugs[bugs.index("## Which kind a bug is"):]
    section = section[:section.index("\n## ", 1)]
    audit_table = re.findall(r"^\| ([A-Z_]+) \|", (ROOT / "docs" / "audit.md").read_text(), re.M)
    return set(re.findall(r"^- \*\*([A-Z_]+)\*\*", section, re.M)) | set(audit_table)


def test_the_table_is_every_constant_of_kinds_py_with_a_meaning():
    constants = {v for k, v in vars(kinds).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(MEANING)
    assert all(isinstance(m, str) and len(m.split()) >= 3 for m in MEANING.values())
    assert set(kinds.BUG_KINDS) | set(kinds.WARNING_KINDS) | set(kinds.NAMED) <= set(MEANING)


def test_every_kind_the_code_can_emit_has_a_meaning_and_is_in_the_docs():
    emitted = kinds_the_code_names()
    emitted.update({f.kind: f"catalog {f.name}" for f in FAULTS.values()})
    emitted.update({k: "parity.audit" for k in AUDIT_KINDS})
    unknown = {k: w for k, w in emitted.items() if k not in MEANING}
    assert not unknown, f"kinds with no meaning in parity/diagnosis/kinds.py: {unknown}"
    undocumented = sorted(set(emitted) - documented_kinds())
    assert not undocumented, f"explain these in docs/bugs.md ('Which kind a bug is') or docs/audit.md: {undocumented}"
    assert set(MEANING) <= set(emitted), f"kinds nothing emits: {sorted(set(MEANING) - set(emitted))}"


def test_the_scan_sees_a_kind_passed_as_a_string(tmp_path):
    tree = ast.parse("Diagnosis('MADE_UP', [], 'full')\nself._diagnosis(kind='OTHER', buffers=[])")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [_kind_argument(c).value for c in calls] == ["MADE_UP", "OTHER"]


@pytest.mark.parametrize("build", [lambda: Diagnosis("MADE_UP", [], "full"),
                                   lambda: make_diagnosis("SHORT_BUFFER", [], owner="g", replay=1)])
def test_a_kind_outside_the_table_or_the_audits_subset_is_refused(build):
    with pytest.raises(ValueError, match="unknown diagnosis kind"):
        build()


def test_the_audit_hands_out_the_record_as_a_dict():
    d = make_diagnosis("STALE_BUFFER", ("x",), owner="g", replay=2, evidence=("e",))
    assert list(d) == list(DIAGNOSIS_KEYS) and d == Diagnosis(**d).as_dict()
    assert (d["mode"], d["step"], d["forward_index"], d["phase"], d["buffers"]) == ("full", 2, 2, "replay", ["x"])
