"""Grading a bug of the second engine (`engine: second`): a patched tests/second_engine under parity.audit.

The patch applies to tests/second_engine/ of a copy of the tree (with its
parity/ and tests/audit_helpers.py, unpatched); the grader runs the engine's
audited workload (`second_run.audit_workload`: `auto_audit`, as
docs/audit-quickstart.md) on the emulated backend (device cpu) or on CUDA, and
grades the audit's errors as `parity run`'s diagnoses are graded:

  graph     NAMED        an error, and every error has the expected kind and names the expected buffers
                         (a role names its holder and everything under it: `self.target_cache` covers
                         `self.target_cache.0.k`), nothing outside `may_also_name`
            LOCALISED    an error is UNKNOWN/UNEXPLAINED in a named graph;  UNDIAGNOSED: without a graph
            WRONG        an error names another kind or other buffers
            MISSED       the audit reports no error
  refactor  CLEAN        no error;  FALSE ALARM otherwise
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.bugs.catalogue import (CLEAN, ERROR, FALSE_ALARM, LOCALISED, MISSED, NAMED, UNDIAGNOSED,
                                  UNEXPLAINED_KINDS, WRONG, Bug, worst)
from tests.bugs.second_run import audit_workload

DEVICE = {"emulated": "cpu", "cuda": "cuda"}
GRADER_ROOT = Path(__file__).resolve().parents[2]    # where tests.bugs.second_run is found (after the copy)


def patched_tree(tree: Path, patch: Path, work: Path) -> str | None:
    """parity/ and the second engine of `tree` copied into `work`, `patch` applied; the error when it does not."""
    shutil.copytree(tree / "parity", work / "parity", ignore=shutil.ignore_patterns("__pycache__", "assets"))
    (work / "parity" / "assets").symlink_to((tree / "parity" / "assets").resolve(), target_is_directory=True)
    shutil.copytree(tree / "tests" / "second_engine", work / "tests" / "second_engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(tree / "tests" / "audit_helpers.py", work / "tests" / "audit_helpers.py")
    shutil.copy(tree / "pyproject.toml", work / "pyproject.toml")
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=work,
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


def _reimport(work: Path) -> None:
    """In a forked child: forget eagle-parity and the second engine; the patched copies come first on the path."""
    import torch
    from torch._library.custom_ops import OPDEFS

    for name in [n for n in OPDEFS if n.startswith("parity::")]:
        OPDEFS[name]._lib._destroy()
    mine = ("parity", "tests", "tests.second_engine", "tests.audit_helpers")
    for name in [m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in mine)
                 and not m.startswith("tests.bugs")]:
        del sys.modules[name]
    sys.path.insert(0, str(work))
    os.chdir(work)
    torch.set_num_threads(1)


def run_audit(work: Path, backend: str, timeout: int, forked: bool) -> dict:
    """What the audit said of the workload on the patched tree in `work` (in this forked child, or a fresh
    interpreter); {"error": text} when the engine or the audit raised."""
    if forked:
        _reimport(work)
        try:
            return audit_workload(DEVICE[backend])
        except Exception as exc:    # the patched engine's failure is the grade, not the grader's
            return {"error": f"{type(exc).__name__}: {exc}"}
    out = work / "audit.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(GRADER_ROOT)]))
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "tests.bugs.second_run", "--device", DEVICE[backend],
                               "--out", str(out)], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if done.returncode != 0 or not out.exists():
        return {"error": (done.stdout + done.stderr).strip()[-2000:] or f"exit {done.returncode}"}
    return json.loads(out.read_text())


def _covers(name: str, role: str) -> bool:
    return name == role or name.startswith(role + ".") or name.startswith(role + "[")


def grade_error(bug: Bug, error: dict) -> str:
    kind, named = error.get("kind"), list(error.get("buffers") or [])
    if kind in UNEXPLAINED_KINDS:
        return LOCALISED if error.get("owner") else UNDIAGNOSED
    if kind is None or kind == "NONE":
        return UNDIAGNOSED
    allowed = bug.buffers + bug.may_also_name
    if kind == bug.kind and all(any(_covers(n, e) for n in named) for e in bug.buffers) \
            and all(any(_covers(n, a) for a in allowed) for n in named):
        return NAMED
    return WRONG


def per_graph(result: dict) -> dict:
    """Per audited graph: 'drift' with its first error's kind, buffers and evidence, or 'pass'."""
    views = {name: {"verdict": "pass"} for name in result.get("graphs", [])}
    for error in result.get("errors", []):
        if views.get(error.get("owner"), {}).get("verdict") != "drift":
            views[error.get("owner")] = {"verdict": "drift", **error}
    return views


def found_text(result: dict) -> str:
    """'KIND(buffers) in graph, graph' per distinct finding."""
    groups: dict[str, list[str]] = {}
    for e in result.get("errors", []):
        text = f"{e.get('kind')}({','.join(e.get('buffers') or [])})"
        groups.setdefault(text, []).append(str(e.get("owner")).removeprefix("SpecEngine.graphs"))
    found = "; ".join(f"{text} in {' '.join(owners)}" for text, owners in groups.items()) or "no error"
    return found + ("" if result.get("outputs_match_eager", True) else " [outputs differ from eager]")


def grade(bug: Bug, work: Path, backend: str, timeout: int, forked: bool) -> tuple[str, str, dict]:
    result = run_audit(work, backend, timeout, forked)
    if "error" in result:
        last = result["error"].strip().splitlines()[-1:] or ["?"]
        return ERROR, f"the audited workload raised: {last[0]}"[:300], {"output": result["error"]}
    extra = {"per_mode": per_graph(result), "findings": result["findings"],
             "outputs_match_eager": result["outputs_match_eager"]}
    errors = result["errors"]
    if bug.cls == "refactor":
        return (FALSE_ALARM if errors else CLEAN), (found_text(result) if errors else "no error"), extra
    if not errors:
        return MISSED, found_text(result), extra
    return worst(grade_error(bug, e) for e in errors), found_text(result), extra
