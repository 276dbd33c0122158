"""Grade the second bug corpus: bugs the bisector was not built with (docs/bugs.md).

For every bug under tests/bugs/corpus/ (`<id>.patch` + `<id>.yaml`): copy the
tree under test (parity/, scenarios/, pyproject.toml) to a temporary folder,
apply the patch, and run exactly what a user runs:

    python -m parity run --scenario scenarios/S.yaml --modes eager,M... --backend B --out DIR --quiet

then read DIR/summary.json and grade:

  graph bugs  NAMED        drifts in every expected mode, every diagnosis has the expected kind
                           and names the expected buffers (and nothing outside `may_also_name`)
              LOCALISED    drifts where expected; a diagnosis is UNKNOWN/UNEXPLAINED with a step and phase
              UNDIAGNOSED  drifts where expected; a diagnosis is missing, NONE, or has no step/phase
              WRONG        drifts where expected; a diagnosis names another kind or other buffers
              MISSED       an expected mode does not drift
              FALSE ALARM  a mode where the bug cannot show drifts
  refactors   CLEAN        every mode passes;  FALSE ALARM otherwise
  eager bugs  CAUGHT       `parity run` passes (no graph bug) and `parity gate --baseline
                           scenarios/baselines/S.json` drifts;  FALSE ALARM if the run drifts,
                           MISSED if the gate passes
  any         NO-APPLY     the patch no longer applies;  ERROR: a command exited other than 0/1

A bug with `engine: second` patches tests/second_engine/ instead and is graded on
what parity.audit says of the engine's audited workload (tests/bugs/second.py).

Exit status: 1 on MISSED, FALSE ALARM, NO-APPLY or ERROR (unless the bug is a known_gap); WRONG is reported, not fatal.

    python -m tests.bugs.grade [--backend emulated|cuda] [--jobs 2] [--only ID ...] [--engine E] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tests.bugs import second
from tests.bugs.catalogue import (CAUGHT, CLEAN, CORPUS, ERROR, FALSE_ALARM, LOCALISED, MISSED, NAMED, NO_APPLY,
                                  SHORT, SKIPPED, UNDIAGNOSED, UNEXPLAINED_KINDS, WRONG, Bug, load_corpus, worst)
from tests.bugs.report import render, totals

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["Bug", "load_corpus", "grade_bugs", "grade_graph", "NAMED", "LOCALISED", "UNDIAGNOSED", "WRONG",
           "MISSED", "FALSE_ALARM", "CLEAN", "CAUGHT"]


# --- one bug: a patched copy of the tree, the user's commands ---------------------------------

def patched_tree(tree: Path, patch: Path, work: Path) -> str | None:
    """Copy the tree under test into `work` and apply `patch`; the error text when it does not apply."""
    shutil.copytree(tree / "parity", work / "parity",
                    ignore=shutil.ignore_patterns("__pycache__", "assets"))
    (work / "parity" / "assets").symlink_to((tree / "parity" / "assets").resolve(), target_is_directory=True)
    shutil.copytree(tree / "scenarios", work / "scenarios", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(tree / "pyproject.toml", work / "pyproject.toml")
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=work,
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


def parity(work: Path, args: list[str], timeout: int) -> tuple[int, str]:
    """`parity <args>` on the patched tree in `work`, in a fresh interpreter: (exit code, output tail)."""
    env = dict(os.environ, PYTHONPATH=str(work) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "parity", *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout} s"
    return done.returncode, (done.stdout + done.stderr)[-4000:]


def import_patched(work: Path):
    """In a forked child: forget this process's eagle-parity and import the patched tree's in its place.

    torch, transformers and the rest stay imported (the 4-8 s a fresh interpreter
    pays); only eagle-parity's own modules (~0.2 s) are read again, from `work`.
    Its torch custom ops are unregistered first, so the patched modules register
    theirs afresh. Returns a runner with `parity`'s signature, called in process.
    """
    import contextlib
    import io

    import torch
    from torch._library.custom_ops import OPDEFS

    for name in [n for n in OPDEFS if n.startswith("parity::")]:
        OPDEFS[name]._lib._destroy()
    for name in [m for m in sys.modules if m == "parity" or m.startswith("parity.")]:
        del sys.modules[name]
    sys.path.insert(0, str(work))
    os.chdir(work)
    torch.set_num_threads(1)
    from parity.cli import main

    def run(_work: Path, args: list[str], _timeout: int) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(args)
        return code, out.getvalue()[-4000:]

    return run


PAIRS: dict[str, tuple[Path, Path]] = {}    # a bug's `head` -> its tiny synth pair, built once by the grader


def build_pairs(bugs: list[Bug]) -> None:
    """The synth pairs the bugs' heads need, built by the unpatched tree before any bug runs (a patch to
    parity/models/ must not change the weights it is graded on)."""
    from parity.commands.matrix import tiny_pair

    for head in {b.head for b in bugs if b.head} - set(PAIRS):
        PAIRS[head] = tiny_pair(head, Path(tempfile.mkdtemp(prefix="bug-pair-")) / "pair")


def run_args(bug: Bug, backend: str, out: Path, modes: list[str], bisect: bool = True) -> list[str]:
    args = ["run", "--scenario", f"scenarios/{bug.scenario}.yaml", "--modes", ",".join(["eager", *modes]),
            "--backend", backend, "--out", str(out), "--quiet"]
    if bug.head:
        target, draft = PAIRS[bug.head]
        args += ["--model", "local", "--target-path", str(target), "--draft-path", str(draft)]
    return args if bisect else args + ["--no-bisect"]


# --- grading ---------------------------------------------------------------------------

def mode_view(summary: dict, mode: str) -> dict:
    diagnosis = (summary.get("diagnoses") or {}).get(mode)
    view = {"verdict": summary["modes"][mode]["verdict"]}
    if diagnosis:
        view.update({k: diagnosis.get(k) for k in ("kind", "buffers", "owner", "step", "phase", "draft_step",
                                                   "evidence", "experiment", "ruled_out") if k in diagnosis})
    return view


def grade_diagnosis(bug: Bug, view: dict) -> str:
    kind, named = view.get("kind"), set(view.get("buffers") or [])
    if kind in UNEXPLAINED_KINDS:
        return LOCALISED if view.get("step") is not None and view.get("phase") else UNDIAGNOSED
    if kind is None or kind == "NONE":
        return UNDIAGNOSED
    expected = set(bug.buffers)
    if kind == bug.kind and expected <= named <= expected | set(bug.may_also_name):
        return NAMED
    return WRONG


def grade_graph(bug: Bug, summary: dict) -> tuple[str, dict]:
    views = {m: mode_view(summary, m) for m in bug.modes + bug.clean_modes}
    grades = [FALSE_ALARM for m in bug.clean_modes if views[m]["verdict"] == "drift"]
    grades += [MISSED for m in bug.modes if views[m]["verdict"] != "drift"]
    grades += [grade_diagnosis(bug, views[m]) for m in bug.modes if views[m]["verdict"] == "drift"]
    return worst(grades), views


def found_text(views: dict) -> str:
    """'full,fdo: KIND(bufs)' per distinct finding; drifts in clean modes are marked."""
    groups: dict[str, list[str]] = {}
    for mode, v in views.items():
        if v["verdict"] != "drift":
            continue
        text = f"{v.get('kind') or 'no diagnosis'}({','.join(v.get('buffers') or [])})"
        if v.get("kind") in UNEXPLAINED_KINDS:
            text += f" @step {v.get('step')} {v.get('phase')}"
        groups.setdefault(text, []).append(SHORT[mode])
    return "; ".join(f"{','.join(modes)}: {text}" for text, modes in groups.items()) or "-"


def header(bug: Bug) -> dict:
    return {"id": bug.id, "engine": bug.engine, "class": bug.cls, "site": bug.site, "known_gap": bug.known_gap, "scenario": bug.scenario, "modes": bug.modes,
            "clean_modes": bug.clean_modes, "expected": bug.expected, "description": bug.description}


def run_bug(bug: Bug, tree: Path, backend: str, timeout: int, keep: Path | None, forked: bool = False) -> dict:
    """Patch a copy of `tree` with `bug` and grade what `parity` (or, on the second engine, the audit) says of it.

    `forked`: this is a child forked for this bug alone; the patched tree is
    imported into it and the commands run in process (emulated backend only).
    """
    result = header(bug)
    if backend not in bug.backends:
        return {**result, "grade": SKIPPED, "found": f"not on {backend}", "seconds": 0.0}
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix=f"bug-{bug.id}-"))
    try:
        error = (second.patched_tree if bug.engine == "second" else patched_tree)(tree, bug.patch, work)
        if error:
            grade, found, extra = NO_APPLY, error.splitlines()[0], {}
        elif bug.engine == "second":
            grade, found, extra = second.grade(bug, work, backend, timeout, forked)
        else:
            runner = import_patched(work) if forked else parity
            grade, found, extra = GRADERS[bug.cls](bug, work, backend, timeout, runner)
    finally:
        if keep is not None:
            shutil.copytree(work, keep / bug.id, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return {**result, "grade": grade, "found": found, **extra, "seconds": round(time.time() - started, 1)}


def grade_bugs(bugs: list[Bug], tree: Path, backend: str, jobs: int = 2, timeout: int = 900,
               keep: Path | None = None) -> list[dict]:
    """Every bug graded, `jobs` at a time: on the emulated backend each in a child forked from this process
    (torch already imported), on CUDA, or once this process has initialised CUDA (neither survives a fork),
    through fresh interpreters."""
    # torch, transformers and the rest imported once, before the forks (parity.cli imports a command's module
    # only when the command runs)
    for command in ("run", "gate"):
        importlib.import_module(f"parity.commands.{command}")
    build_pairs(bugs)
    from parity.harness.forked import ForkedError, fork_map, forkable

    if backend != "emulated" or not forkable():
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            return list(pool.map(lambda b: run_bug(b, tree, backend, timeout, keep), bugs))

    outcomes = fork_map(lambda b: run_bug(b, tree, backend, timeout, keep, forked=True), bugs, jobs,
                        timeout=timeout, return_errors=True)
    return [{**header(b), "grade": ERROR, "found": str(o).splitlines()[-1][:200], "output": str(o)[-4000:],
             "seconds": 0.0} if isinstance(o, ForkedError) else o for b, o in zip(bugs, outcomes)]


def _graph(bug: Bug, work: Path, backend: str, timeout: int, parity=parity):
    rc, tail = parity(work, run_args(bug, backend, work / "out", bug.modes + bug.clean_modes), timeout)
    if rc not in (0, 1):
        return ERROR, f"parity run exited {rc}", {"output": tail}
    summary = json.loads((work / "out" / "summary.json").read_text())
    grade, views = grade_graph(bug, summary)
    return grade, found_text(views), {"per_mode": views}


def _refactor(bug: Bug, work: Path, backend: str, timeout: int, parity=parity):
    rc, tail = parity(work, run_args(bug, backend, work / "out", bug.modes), timeout)
    if rc not in (0, 1):
        return ERROR, f"parity run exited {rc}", {"output": tail}
    summary = json.loads((work / "out" / "summary.json").read_text())
    views = {m: mode_view(summary, m) for m in bug.modes}
    drifting = [m for m, v in views.items() if v["verdict"] == "drift"]
    return (FALSE_ALARM if drifting else CLEAN), (found_text(views) if drifting else "all pass"), {"per_mode": views}


def _eager(bug: Bug, work: Path, backend: str, timeout: int, parity=parity):
    rc, tail = parity(work, run_args(bug, backend, work / "out", bug.modes, bisect=False), timeout)
    if rc not in (0, 1):
        return ERROR, f"parity run exited {rc}", {"output": tail}
    if rc == 1:
        return FALSE_ALARM, "parity run drifts: " + tail.strip().splitlines()[-1][:100], {"output": tail}
    gate = ["gate", "--scenario", f"scenarios/{bug.scenario}.yaml", "--modes", ",".join(["eager", *bug.modes]),
            "--backend", backend, "--baseline", f"scenarios/baselines/{bug.scenario}.json"]
    rc, tail = parity(work, gate, timeout)
    last = next((line for line in reversed(tail.splitlines()) if line.startswith("GATE")), tail[-200:])
    if rc not in (0, 1):
        return ERROR, f"parity gate exited {rc}", {"output": tail}
    failed = re.search(r"\d+ of \d+ checks failed", last)
    verdict = "GATE DRIFT" if rc == 1 else "GATE PASS"
    return (CAUGHT if rc == 1 else MISSED), f"run PASS; {verdict}" + (f" ({failed.group(0)})" if failed else ""), \
        {"gate": last}


GRADERS = {"graph": _graph, "refactor": _refactor, "eager": _eager}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tests.bugs.grade", description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to patch (default: this one)")
    parser.add_argument("--backend", default="emulated", choices=("emulated", "cuda"))
    parser.add_argument("--jobs", type=int, default=2, help="bugs run in parallel (default 2)")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="folder of <id>.patch + <id>.yaml")
    parser.add_argument("--only", "--bugs", nargs="+", metavar="ID", help="grade only these bugs")
    parser.add_argument("--engine", choices=("harness", "second"), help="grade only this engine's bugs")
    parser.add_argument("--json", type=Path, default=ROOT / "reports" / "bug-corpus.json", help="JSON report")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per parity command")
    parser.add_argument("--keep", type=Path, default=None, help="keep each patched tree and its run here")
    args = parser.parse_args(argv)
    bugs = load_corpus(args.corpus)
    if args.only:
        unknown = set(args.only) - {b.id for b in bugs}
        if unknown:
            parser.error(f"unknown bug(s): {', '.join(sorted(unknown))}")
        bugs = [b for b in bugs if b.id in args.only]
    bugs = [b for b in bugs if args.engine in (None, b.engine)]
    started = time.time()
    results = grade_bugs(bugs, args.tree.resolve(), args.backend, args.jobs, args.timeout, args.keep)
    elapsed = time.time() - started
    summary = totals(results)
    render(results, summary, args.backend, elapsed)
    report = {"backend": args.backend, "tree": str(args.tree.resolve()), "elapsed_s": round(elapsed, 1),
              "totals": summary, "bugs": results, "corpus": [asdict(b) | {"patch": b.patch.name} for b in bugs]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"report: {args.json}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
