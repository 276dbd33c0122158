"""Hostile inputs for the fuzz tests: mutations of real files, and the one rule every outcome must obey.

Inputs start from files the CLI accepts (the tiny scenario, the committed
prompt set, vLLM's metrics and printed text from tests/data, a golden
summary.json, a baseline written by `parity gate`) and are then mutated the
ways files really go wrong: a key with the wrong type or an absurd value, a
key dropped or misspelt, another encoding, a truncated upload, bytes flipped,
binary junk, NaN and negative counts, duplicated series, huge and deeply
nested values. The rule (`check_outcome`): exit 0, 1 or 2; exit 2 is one
line on stderr; never a traceback; never a partial folder.

Hypothesis profiles: "parity-ci" (few examples per kind, derandomized so CI
is reproducible) and "parity-soak" (random; `make fuzz` runs it for a
bounded time), chosen by PARITY_FUZZ_PROFILE.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from robustkit import ROOT, TINY, complete_run, hidden

settings.register_profile("parity-ci", deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("parity-soak", deadline=None, derandomize=False, database=None, print_blob=True,
                          suppress_health_check=list(HealthCheck))
PROFILE = settings.get_profile(f"parity-{os.environ.get('PARITY_FUZZ_PROFILE', 'ci')}")

DATA = ROOT / "tests" / "data"
GOLDEN = ROOT / "tests" / "golden"
VLLM_FILES = sorted(DATA.glob("*.prom")) + sorted(DATA.glob("*.txt"))
SUMMARIES = sorted(GOLDEN.glob("*/summary.json"))
ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32", "latin-1", "cp1252", "ascii")


def _encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding, errors="replace")


# --- values a file can hold -------------------------------------------------------------------------

NASTY_NUMBERS = st.sampled_from([0, 1, -1, 2, 3, 4, 31, 32, 33, 64, 1 << 20, (1 << 20) + 1, 1 << 31, (1 << 63) - 1,
                                 1 << 63, -(1 << 63), 10 ** 30, 0.5, -0.0, 1e-300, 1e308, math.inf, -math.inf,
                                 math.nan])
NASTY_STRINGS = st.sampled_from(["", " ", "eager", "full", "piecewise", "all", "eager,full", "x" * 5000, "\x00",
                                 "../../etc/passwd", "nowhere.jsonl", "\u2028", "\ud7ff\ue000", "é", "1e3",
                                 "true", "null", "~", "!!python/object:os.system", "<<"])
SCALARS = st.one_of(NASTY_NUMBERS, NASTY_STRINGS, st.booleans(), st.none(), st.integers(), st.floats(),
                    st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


# --- structured mutations of JSON-like data (scenarios, summaries, baselines) --------------------------

def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _apply(data, path, action, value):
    if not path:
        return value if action == "set" else data
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "set":
        parent[last] = value
    elif action == "rename" and isinstance(parent, dict):
        parent[str(last)[:-1] + "_"] = parent.pop(last)
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(last, parent[last])
    return data


@st.composite
def mutated(draw, data, max_mutations: int = 3):
    """`data` (deep-copied) with 1..max_mutations random set/delete/rename/duplicate edits at random paths."""
    data = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = list(_paths(data))
        shallow = [p for p in paths if len(p) <= 1]      # half the edits break the structure itself
        path = draw(st.sampled_from(shallow if draw(st.booleans()) else paths))
        action = draw(st.sampled_from(["set", "set", "set", "delete", "rename", "duplicate"]))
        data = _apply(data, path, action, draw(VALUES) if action == "set" else None)
    return data


@st.composite
def corrupted(draw, text: str):
    """Bytes of `text` as files really break: another encoding, truncated, bytes flipped, junk, repeated lines."""
    kind = draw(st.sampled_from(["encoding", "truncate", "flip", "junk", "repeat", "binary", "none"]))
    raw = _encode(text, draw(st.sampled_from(ENCODINGS)) if kind == "encoding" else "utf-8")
    if kind == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif kind == "flip" and raw:
        data = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        raw = bytes(data)
    elif kind == "junk":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=64)) + raw[at:]
    elif kind == "repeat" and raw.strip():
        lines = raw.splitlines(keepends=True)
        line = draw(st.sampled_from(lines))
        raw = raw + line * draw(st.integers(1, 2000))
    elif kind == "binary":
        raw = draw(st.binary(max_size=512))
    return raw


def yaml_bomb(depth: int) -> str:
    """A YAML alias bomb (each level repeats the previous 9 times) or, for depth > 9, deep nesting."""
    if depth > 9:
        return "prompts: x\ncapture_sizes: " + "[" * depth * 50 + "]" * depth * 50 + "\n"
    lines = ["a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return "\n".join(lines) + f"\narrivals: *a{depth}\nprompts: x\n"


# --- the rule -------------------------------------------------------------------------------------

def check_outcome(code: int, out: str, err: str, out_dir: Path | None = None) -> None:
    """Exit 0/1/2, exit 2 in one line, no traceback, and no partial run folder (nor a hidden staging one)."""
    assert code in (0, 1, 2), f"exit {code}: {err[-2000:]}{_saved_traceback(err)}"
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("parity: error: "), err[-2000:]
    if out_dir is not None:
        assert not out_dir.exists() or complete_run(out_dir), f"partial run folder {out_dir}"
        assert not [p for p in hidden(out_dir.parent) if "parity-staging" in p.name], "staging folder left"


def _saved_traceback(err: str) -> str:
    """The end of the traceback file an exit 3 names, for the failure message."""
    match = re.search(r"traceback saved to (\S+?);", err)
    if not match or not Path(match.group(1)).is_file():
        return ""
    return "\n" + "\n".join(Path(match.group(1)).read_text().splitlines()[-12:])


def tiny_yaml_data(prompts: Path | None = None, **overrides) -> dict:
    return {**TINY, "prompts": str(prompts or TINY["prompts"]), "modes": ["eager"], **overrides}


def dump_yaml(data) -> str:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return json.dumps(data, default=str)
