"""The house rules, read from the source: one-way layers, faults at one seam, small files.

Every import counts, function-level ones included (they hide cycles). Rooms
are the folders under parity/; the rules say which rooms each may import:

    models     -> models
    graphs     -> graphs, models
    engine     -> engine, graphs, models     (the greedy draft sampling op lives with the other custom ops)
    analysis   -> analysis
    report     -> report, analysis           (renderers render analysis results)
    importers  -> importers, analysis
    diagnose   -> diagnose, engine, graphs, analysis
    harness    -> harness, engine, graphs, models, analysis, diagnose, importers
    faults     -> faults, engine, graphs, analysis
    builders   -> builders, models, engine  (the embedded pairs' training, `parity models synth`)
    audit      -> audit, graphs             (the public API for other engines' graphs)
    diagnosis  -> diagnosis                 (the kinds and their meanings, the Diagnosis record, its panel)
    scripts    -> scripts and the product   (release and profiling, `python -m parity.scripts.X`)
    commands   -> anything
nothing imports scripts, and only commands import faults or builders (the product never reaches what writes model files). `errors`, `files` (the one reader
of user files), `diagnosis` (what every layer says a diagnosis is) and the package itself (`parity.__version__`)
are open to all.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from parity.engine.parts import EngineParts
from parity.faults.catalog import FAULTS
from parity.faults.seam import MUTATIONS, apply
from parity.graphs.policy import CapturePolicy

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "parity"
OPEN = {"errors", "files", "diagnosis", ""}
ALLOWED = {
    "models": {"models"},
    "graphs": {"graphs", "models"},
    "engine": {"engine", "graphs", "models"},
    "analysis": {"analysis"},
    "report": {"report", "analysis"},
    "importers": {"importers", "analysis"},
    "diagnose": {"diagnose", "engine", "graphs", "analysis", "audit"},
    "harness": {"harness", "engine", "graphs", "models", "analysis", "diagnose", "importers"},
    "faults": {"faults", "engine", "graphs", "analysis"},
    "builders": {"builders", "models", "engine"},
    "audit": {"audit", "graphs"},
    "diagnosis": {"diagnosis"},
    "scripts": {"scripts", "models", "graphs", "engine", "analysis", "report", "importers", "diagnose", "harness",
                "audit"},
}
# Rooms that must read like the engine a user runs: no fault names, no `faults` anything.
CLEAN_ROOMS = ("engine", "graphs", "models", "harness", "diagnose", "analysis", "diagnosis")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(path: Path, name: str, known) -> set[str]:
    """Every parity module `path` imports, anywhere in the file (`from pkg import mod` counts as mod)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known}


def room(module: str) -> str:
    """The folder a module lives in under parity/; '' for the entry points, 'errors' / 'files' for those files."""
    parts = module.split(".")
    if len(parts) == 2 and parts[1] in ("cli", "__main__"):
        return ""
    return parts[1] if len(parts) > 1 else ""


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, name, mods) - {name} for name, path in mods.items()}


def test_layers_import_only_what_they_may(graph):
    broken = []
    for name, deps in graph.items():
        own = room(name)
        if own in ("commands", ""):     # commands and entry points on top
            continue
        if own in ("errors", "files"):  # open to all, so they import nothing of ours but errors
            assert deps <= {"parity.errors"}, f"{name} imports {sorted(deps - {'parity.errors'})}"
            continue
        assert own in ALLOWED, f"room {own!r} has no layer rule: add one here and in docs/architecture.md"
        broken += [f"{name} -> {dep}" for dep in deps
                   if room(dep) not in OPEN and room(dep) != own and room(dep) not in ALLOWED[own]]
    assert not broken, "layer violations:\n" + "\n".join(sorted(broken))


def test_only_commands_import_faults_or_builders(graph):
    broken = [f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
              if room(dep) in ("faults", "builders") and room(name) not in ("commands", room(dep))]
    assert not broken, "\n".join(sorted(broken))


def test_nothing_imports_the_scripts(graph):
    broken = [f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
              if room(dep) == "scripts" and room(name) != "scripts"]
    assert not broken, "\n".join(sorted(broken))


def test_the_builders_live_in_their_wing_only():
    """What writes model files (training, synthesis, savers) stays out of the rooms the product is made of."""
    stray = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
             if room(".".join(p.relative_to(ROOT).with_suffix("").parts)) != "builders"
             and re.match(r"(synth|saver|shards)", p.name)]
    assert not stray, f"builders outside parity/builders/: {stray}"
    assert not (PACKAGE / "training").exists()


def test_no_import_cycle(graph):
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


def test_top_level_holds_only_the_entry_points():
    names = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    files = {n for n in names if (PACKAGE / n).is_file()}
    # py.typed: the marker that lets other projects' type checkers read parity.audit's annotations.
    assert files == {"__init__.py", "__main__.py", "cli.py", "errors.py", "files.py", "py.typed"}


@pytest.mark.parametrize("room_name", CLEAN_ROOMS)
def test_clean_rooms_never_name_a_fault(room_name):
    names = re.compile("|".join(re.escape(n) for n in FAULTS))
    for path in (PACKAGE / room_name).rglob("*.py"):
        text = path.read_text()
        assert not names.search(text), f"{path.relative_to(ROOT)} names a catalogued fault"
        tree = ast.parse(text)
        for node in ast.walk(tree):
            named = []
            if isinstance(node, ast.arg):
                named = [node.arg]
            elif isinstance(node, (ast.Name, ast.Attribute)):
                named = [node.id if isinstance(node, ast.Name) else node.attr]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = [node.value]
            assert "faults" not in named, f"{path.relative_to(ROOT)}:{node.lineno}: something named 'faults'"


def test_mutations_cover_exactly_the_catalog_through_the_seam():
    assert set(MUTATIONS) == set(FAULTS)
    clean_parts, clean_policy = EngineParts(), CapturePolicy()
    for name in FAULTS:
        parts, policy = apply([name])
        assert (parts, policy) != (clean_parts, clean_policy), f"{name} changes nothing"
        for field in ("target_runner", "target_builder", "proposer", "drafter_builder"):
            changed, clean = getattr(parts, field), getattr(clean_parts, field)
            assert changed is clean or issubclass(changed, clean), f"{name}: {field} is not a subclass"


# The captured bodies' parameters are the executors' calling convention (`Forward.fn(num_tokens_padded,
# num_reqs_padded, meta)`), the same for every forward whichever of them it reads.
FORWARD_BODIES = {"verify", "prefill_forward", "step_forward"}
SEAM_MODULES = ("parity.faults.", "parity.harness.simulated_numerics")


def _unread_parameters(fn) -> list[str]:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs][1:]   # not self
    read = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return [p for p in params if p not in read]


def test_no_production_step_takes_a_parameter_only_the_seam_reads():
    """Every step a fault or the numerics seam overrides reads each parameter the engine passes it: what
    only a mutation needs, the mutation picks up behind the seam (faults/peek.py), not the engine's signature."""
    from parity.harness.simulated_numerics import simulate_padding_numerics

    variants = [apply([name]) for name in FAULTS] + [(simulate_padding_numerics(EngineParts(), 0.1), CapturePolicy())]
    classes = {cls for parts, policy in variants
               for cls in [*parts.roles().values(), policy.executor]}
    unread = set()
    for cls in classes:
        seam = [c for c in cls.__mro__ if c.__module__.startswith(SEAM_MODULES)]
        for name in {n for c in seam for n, v in vars(c).items() if inspect.isfunction(v)} - FORWARD_BODIES:
            owner = next((c for c in cls.__mro__ if name in vars(c) and c not in seam), None)
            if owner is not None and owner.__module__.startswith("parity."):
                unread |= {f"{owner.__name__}.{name}: {p}" for p in _unread_parameters(vars(owner)[name])}
    assert not unread, "production steps taking what only the seam reads:\n" + "\n".join(sorted(unread))


def test_no_owner_chains_outside_the_engine():
    chain = re.compile(r"engine\.(target|proposer)\.")
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name != "engine":
            assert not chain.search(path.read_text()), f"{path.relative_to(ROOT)} reaches into engine owners"


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_files_and_functions_stay_small():
    too_long = []
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        if len(lines) > 300:
            too_long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
        for fn in _functions(ast.parse("\n".join(lines))):
            length = fn.end_lineno - fn.lineno + 1
            if length > 60:
                too_long.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}: {length} lines")
    assert not too_long, "\n".join(too_long)
    assert len((PACKAGE / "cli.py").read_text().splitlines()) < 120


def test_engine_settings_have_one_home():
    """A scenario is built on the engine's settings: their names, defaults and rules live in engine/config.py."""
    from dataclasses import fields

    from parity.engine.config import EngineConfig, EngineSettings
    from parity.harness.scenario import Scenario

    own = {f.name: f.default for f in fields(EngineSettings)}
    assert issubclass(Scenario, EngineSettings) and issubclass(EngineConfig, EngineSettings)
    for cls in (Scenario, EngineConfig):
        assert {f.name: f.default for f in fields(cls) if f.name in own} == own
        assert cls.__post_init__ is EngineSettings.__post_init__, f"{cls.__name__} checks settings its own way"
        assert not set(own) & set(vars(cls).get("__annotations__", {})), f"{cls.__name__} declares a setting again"


def test_facts_named_again_across_a_layer_boundary_agree():
    """Where a layer may not import the room that owns a fact, it names it again: the two must agree."""
    from parity.analysis import baseline, compare
    from parity.engine import config
    from parity.graphs import modes
    from parity.report.modes import LOOK

    assert tuple(LOOK) == modes.MODES                       # renderers show every mode, in order
    assert compare.EAGER == modes.EAGER
    assert baseline.MAX_K == config.MAX_K                   # a baseline file's K is one the engine takes
