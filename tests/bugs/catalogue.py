"""The second bug corpus's records: what a bug is, its grades, and how its files are read (docs/bugs.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from parity.diagnosis.kinds import BUG_KINDS
from parity.graphs.modes import EAGER
from parity.graphs.modes import MODES as ALL_MODES

CORPUS = Path(__file__).resolve().parent / "corpus"
ROOT = CORPUS.parents[2]
# What a patch may touch, per engine: eagle-parity's own engine, or the second engine of the tests.
PATCHABLE = {"harness": ("parity/engine/", "parity/graphs/", "parity/models/"),
             "second": ("tests/second_engine/",)}
CLASSES = {"harness": ("graph", "refactor", "eager"), "second": ("graph", "refactor")}
MODES = tuple(m for m in ALL_MODES if m != EAGER)
UNEXPLAINED_KINDS = ("UNKNOWN", "UNEXPLAINED")
NAMED, LOCALISED, UNDIAGNOSED, WRONG = "NAMED", "LOCALISED", "UNDIAGNOSED", "WRONG"
MISSED, FALSE_ALARM, CLEAN, CAUGHT = "MISSED", "FALSE ALARM", "CLEAN", "CAUGHT"
NO_APPLY, ERROR, SKIPPED = "NO-APPLY", "ERROR", "SKIPPED"
FATAL = (MISSED, FALSE_ALARM, NO_APPLY, ERROR)
# When modes grade differently, the bug gets the worst.
SEVERITY = (ERROR, NO_APPLY, FALSE_ALARM, MISSED, WRONG, UNDIAGNOSED, LOCALISED, NAMED, CAUGHT, CLEAN, SKIPPED)
SHORT = {"piecewise": "pw", "full": "full", "full_decode_only": "fdo", "full_and_piecewise": "f+pw"}


@dataclass
class Bug:
    id: str
    cls: str
    description: str
    site: str
    scenario: str
    modes: list[str]
    clean_modes: list[str] = field(default_factory=list)
    seed: str = ""
    kind: str | None = None
    buffers: list[str] = field(default_factory=list)
    may_also_name: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=lambda: ["emulated", "cuda"])
    patch: Path = Path()
    engine: str = "harness"           # harness: `parity run` on eagle-parity's engine; second: tests/second_engine
    known_gap: str | None = None      # what the tool says today of a bug it does not get right
    head: str = ""                    # a synth pair's head ("mtp-deepseek --mtp-layers 3"); "": the embedded pair

    @property
    def expected(self) -> str:
        if self.cls == "graph":
            return f"{self.kind}({','.join(self.buffers)})"
        return "no drift" if self.cls == "refactor" else "run PASS, gate DRIFT"

    @property
    def expected_grade(self) -> str:
        return {"graph": NAMED, "refactor": CLEAN, "eager": CAUGHT}[self.cls]


def worst(grades) -> str:
    return min(grades, key=SEVERITY.index)


def patched_files(patch_text: str) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/\S+$", patch_text, flags=re.M)


def landed_line(patch_text: str, path: str, root: Path = ROOT) -> int | None:
    """The line number, in this tree's `path` once patched, of the first line the patch adds to it: each hunk's old
    side is found in the file as it is (as `git apply` finds it, wherever edits above have moved it); None when a
    hunk's old side is not in the file."""
    lines = (root / path).read_text().splitlines()
    section = re.search(rf"^diff --git a/{re.escape(path)} b/.*?(?=^diff --git |\Z)", patch_text, flags=re.M | re.S)
    shift = 0        # lines added minus removed by the hunks above
    for hunk in re.split(r"^@@[^\n]*\n", section.group(0) if section else "", flags=re.M)[1:]:
        body = [line for line in hunk.splitlines() if line[:1] in (" ", "-", "+")]
        old = [line[1:] for line in body if line[0] != "+"]
        new = [line for line in body if line[0] != "-"]
        start = next((i for i in range(len(lines) - len(old) + 1) if lines[i:i + len(old)] == old), None)
        if start is None:
            return None
        added = [i for i, line in enumerate(new) if line[0] == "+"]
        if added:
            return start + shift + added[0] + 1
        shift += len(new) - len(old)
    return None


def _resolve_lines(buffers: list[str], patch_text: str) -> list[str]:
    """An expected CAPTURE_ERROR source line written "path:+" (the line the patch adds) as "path:N" in this tree."""
    resolved = []
    for name in buffers:
        if name.endswith(".py:+"):
            n = landed_line(patch_text, name[:-2])
            name = name if n is None else f"{name[:-2]}:{n}"
        resolved.append(name)
    return resolved


def _check_modes(meta: dict, engine: str, where: str) -> tuple[list[str], list[str]]:
    if engine == "second":
        if meta.get("modes") or meta.get("clean_modes") or meta.get("scenario"):
            raise ValueError(f"{where}: a second-engine bug runs the audited workload: no scenario or modes")
        return [], []
    for key in ("scenario", "modes"):
        if key not in meta:
            raise ValueError(f"{where}: missing {key!r}")
    modes, clean = list(meta["modes"]), list(meta.get("clean_modes") or [])
    if not modes or any(m not in MODES for m in modes + clean) or set(modes) & set(clean):
        raise ValueError(f"{where}: modes/clean_modes must be disjoint graph modes {MODES}")
    return modes, clean


def load_bug(meta_path: Path) -> Bug:
    """One bug from its metadata and patch; ValueError names the file and the problem."""
    meta = yaml.safe_load(meta_path.read_text())
    where = meta_path.name
    for key in ("id", "class", "description", "site"):
        if key not in meta:
            raise ValueError(f"{where}: missing {key!r}")
    if meta["id"] != meta_path.stem:
        raise ValueError(f"{where}: id {meta['id']!r} differs from the file name")
    engine = meta.get("engine", "harness")
    if engine not in PATCHABLE:
        raise ValueError(f"{where}: engine must be one of {tuple(PATCHABLE)}")
    if meta["class"] not in CLASSES[engine]:
        raise ValueError(f"{where}: class must be one of {CLASSES[engine]} on the {engine} engine")
    modes, clean = _check_modes(meta, engine, where)
    expect = meta.get("expect") or {}
    if meta["class"] == "graph" and (expect.get("kind") not in BUG_KINDS or not expect.get("buffers")):
        raise ValueError(f"{where}: a graph bug needs expect.kind in {BUG_KINDS} and expect.buffers")
    if "known_gap" in meta and not (isinstance(meta["known_gap"], str) and meta["known_gap"].strip()):
        raise ValueError(f"{where}: known_gap must say what the tool said")
    patch = meta_path.with_suffix(".patch")
    if not patch.is_file():
        raise ValueError(f"{where}: no {patch.name}")
    files = patched_files(patch.read_text())
    if not files or any(not f.startswith(PATCHABLE[engine]) for f in files):
        raise ValueError(f"{patch.name}: must touch only {', '.join(PATCHABLE[engine])} (touches {files})")
    return Bug(meta["id"], meta["class"], meta["description"], meta["site"], meta.get("scenario", ""), modes,
               clean, str(meta.get("seed", "")), expect.get("kind"),
               _resolve_lines(list(expect.get("buffers") or []), patch.read_text()),
               list(expect.get("may_also_name") or []), list(meta.get("backends") or ["emulated", "cuda"]), patch,
               engine, meta.get("known_gap"), str(meta.get("head") or ""))


def load_corpus(corpus: Path = CORPUS) -> list[Bug]:
    bugs = [load_bug(p) for p in sorted(corpus.glob("*.yaml"))]
    strays = {p.stem for p in corpus.glob("*.patch")} - {b.id for b in bugs}
    if strays:
        raise ValueError(f"patches without metadata: {', '.join(sorted(strays))}")
    return bugs
