"""Scenario files: YAML, validated on load with file, line and reason.

A scenario fixes everything a run depends on except the model and the modes
given on the command line: prompts, batch composition and arrivals, engine
limits, sampling, graph capture sizes and the tolerances of the verdict. The
engine's settings (limits, sampling, sliding window) are `EngineSettings`: the
scenario is built on it, so their names, defaults and rules live in
`engine/config.py` and a file breaking one is told so at the key's line.

Anything a file can hold is answered with one line: binary junk, another
encoding, YAML tags, nesting, absurd sizes (every count is capped at MAX_COUNT,
far above any real engine's and below where int32 index tensors or the host's
memory give out), NaN and infinities, and values shown in messages are cut
short (a YAML alias bomb repeats one list a billion times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from parity.analysis.tolerances import Tolerances
from parity.engine.config import MAX_K, EngineSettings, SettingError
from parity.errors import ParityInputError
from parity.graphs.modes import MODES
from parity.files import is_file, read_text_file, show
from parity.harness.prompts import read_prompts


@dataclass(frozen=True, kw_only=True)
class Scenario(EngineSettings):
    """The engine's settings (`EngineSettings`, checked on construction) and the run around them."""

    name: str
    path: str
    prompts_file: str
    prompts: tuple[tuple[str, str], ...]            # (id, text)
    num_requests: int
    arrivals: tuple[int, ...]                       # engine step of each request's arrival
    max_tokens: int = 32
    capture_sizes: tuple[int, ...] | None = None
    modes: tuple[str, ...] = MODES
    drafter_mode: str | None = None
    shared_drafter_pool: bool = False
    overlap: bool = False          # graph modes run the overlapped loop (engine/overlap.py, docs/overlap.md)
    tolerances: Tolerances = field(default_factory=Tolerances)
    description: str = ""


# key -> (type check, description of what is expected)
_SCALARS = {
    "name": (str, "a string"),
    "description": (str, "a string"),
    "prompts": (str, "a path to a JSONL prompt file"),
    "num_requests": (int, "a positive integer"),
    "max_tokens": (int, "a positive integer"),
    "max_num_seqs": (int, "a positive integer"),
    "max_num_batched_tokens": (int, "a positive integer"),
    "num_speculative_tokens": (int, f"an integer in 1..{MAX_K}"),
    "temperature": ((int, float), "a number >= 0"),
    "seed": (int, "an integer"),
    "block_size": (int, "a positive integer"),
    "topk": (int, "an integer in 1..8"),
    "num_draft_tokens": (int, "a positive integer"),
    "max_model_len": (int, "a positive integer"),
    "drafter_mode": (str, "a mode name"),
    "shared_drafter_pool": (bool, "true or false"),
    "overlap": (bool, "true or false"),
}
_LISTS = {"arrivals", "capture_sizes", "modes", "sliding_window"}
_TOLERANCE_KEYS = {f.name: f.type for f in fields(Tolerances)}
MAX_COUNT = 1 << 20          # requests, tokens, sizes: a million is past any scenario this harness runs
MAX_TEMPERATURE = 1e4
# NOTE: bounds on time, not memory (the memory plan bounds that): a KV block larger than vLLM's largest is
# no cache layout an engine uses, and the work of a run grows with the tokens it emits; a million-token
# block or a million requests of a million tokens each "fit" and then run for hours.
MAX_BLOCK_SIZE = 1024
MAX_TOTAL_TOKENS = 1 << 22

class _Checker:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, node, reason: str):
        line = node.start_mark.line + 1 if node is not None else 1
        raise ParityInputError(f"{self.path}:{line}: {reason}")


def _value(check: _Checker, node):
    try:
        return yaml.safe_load(yaml.serialize(node))
    except yaml.YAMLError as exc:       # tags safe_load refuses (!!python/object, ...), bad !!int, ...
        check.fail(node, f"unsupported value ({' '.join(str(getattr(exc, 'problem', exc)).split())})")


def _compose(path: Path, check: _Checker):
    try:
        return yaml.compose(read_text_file(path, "scenario file"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ParityInputError(f"{path}:{line}: not valid YAML ({problem})") from None
    except RecursionError:
        check.fail(None, "not a scenario: nested too deeply")


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate a scenario file; every problem is one ParityInputError line."""
    path = Path(path)
    if not is_file(path):
        raise ParityInputError(f"{path}: scenario file not found")
    check = _Checker(path)
    root = _compose(path, check)
    if not isinstance(root, yaml.MappingNode):
        check.fail(root, "a scenario must be a mapping of keys to values")
    raw: dict = {}
    nodes: dict = {}
    for key_node, value_node in root.value:
        if not isinstance(key_node, yaml.ScalarNode):
            check.fail(key_node, "keys must be plain names")
        key = key_node.value
        if key in nodes:
            check.fail(key_node, f"duplicate key {show(key)}")
        nodes[key] = (key_node, value_node)
        if key == "tolerances":
            raw[key] = _tolerances(check, value_node)
        elif key in _SCALARS:
            kind, expected = _SCALARS[key]
            value = _value(check, value_node)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                check.fail(value_node, f"{key} must be {expected}, got {show(value)}")
            raw[key] = value
        elif key in _LISTS:
            raw[key] = _value(check, value_node)
        else:
            known = sorted(list(_SCALARS) + list(_LISTS) + ["tolerances"])
            check.fail(key_node, f"unknown key {show(key)} (known: {', '.join(known)})")
    return _build(path, check, raw, nodes)


def _tolerances(check: _Checker, node) -> Tolerances:
    if not isinstance(node, yaml.MappingNode):
        check.fail(node, "tolerances must be a mapping")
    values = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key not in _TOLERANCE_KEYS:
            check.fail(key_node, f"unknown tolerance {show(key)} (known: {', '.join(_TOLERANCE_KEYS)})")
        value = _value(check, value_node)
        if key in ("require_token_parity", "require_draft_parity"):
            if not isinstance(value, bool):
                check.fail(value_node, f"{key} must be true or false, got {show(value)}")
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value) or value < 0:
            check.fail(value_node, f"{key} must be a number >= 0, got {show(value)}")
        elif key == "alpha" and not 0 < value < 1:
            check.fail(value_node, f"alpha (a significance level) must be between 0 and 1, got {value}")
        values[key] = value
    return Tolerances(**values)


def _positive(check, nodes, raw, key):
    if key in raw and not 1 <= raw[key] <= MAX_COUNT:
        check.fail(nodes[key][1], f"{key} must be a positive integer up to {MAX_COUNT}, got {raw[key]}")


def _build(path: Path, check: _Checker, raw: dict, nodes: dict) -> Scenario:
    node = lambda key: nodes[key][1] if key in nodes else None  # noqa: E731
    if "prompts" not in raw:
        check.fail(None, "missing required key 'prompts'")
    for key in ("num_requests", "max_tokens"):
        _positive(check, nodes, raw, key)
    settings = _settings(check, node, raw)
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if getattr(settings, key) > MAX_COUNT:
            check.fail(node(key), f"{key} must be at most {MAX_COUNT}, got {getattr(settings, key)}")
    if settings.block_size > MAX_BLOCK_SIZE:
        check.fail(node("block_size"), f"block_size must be at most {MAX_BLOCK_SIZE} tokens, got "
                                       f"{settings.block_size}")
    if settings.block_size > settings.max_model_len:
        check.fail(node("block_size"), f"block_size {settings.block_size} is larger than max_model_len "
                                       f"{settings.max_model_len}")
    if not settings.temperature <= MAX_TEMPERATURE:      # also refuses infinity
        check.fail(node("temperature"), f"temperature must be at most {MAX_TEMPERATURE:g}, got {raw['temperature']}")
    if "name" in raw and (not raw["name"].strip() or not raw["name"].isprintable() or len(raw["name"]) > 200):
        check.fail(node("name"), f"name must be 1 to 200 printable characters, got {show(raw['name'])}")

    prompts_path = _prompts_path(check, node("prompts"), path, raw["prompts"])
    if not is_file(prompts_path):
        check.fail(node("prompts"), f"prompts file {prompts_path} not found")
    prompts = read_prompts(prompts_path)
    num_requests = raw.get("num_requests", len(prompts))
    total = num_requests * raw.get("max_tokens", _default("max_tokens"))
    if total > MAX_TOTAL_TOKENS:
        check.fail(node("max_tokens") or node("num_requests"),
                   f"num_requests x max_tokens = {total} output tokens: more than {MAX_TOTAL_TOKENS} is hours "
                   f"of work, not a parity scenario")

    arrivals = _arrivals(check, node("arrivals"), raw.get("arrivals", [0]), num_requests)
    sizes = _capture_sizes(check, node("capture_sizes"), raw.get("capture_sizes"))
    modes = _modes(check, node, raw)
    window, window_layers = _window(check, node("sliding_window"), raw.get("sliding_window"))

    values = {key: raw[key] for key in ("max_tokens", "drafter_mode", "shared_drafter_pool", "overlap", "description")
              if key in raw}
    engine = {**settings.settings(), "temperature": float(settings.temperature), "sliding_window": window,
              "sliding_window_layers": window_layers}
    return Scenario(
        name=raw.get("name", path.stem), path=str(path), prompts_file=str(prompts_path),
        prompts=tuple(prompts), num_requests=num_requests, arrivals=tuple(arrivals),
        capture_sizes=sizes, modes=tuple(modes), tolerances=raw.get("tolerances", Tolerances()), **engine, **values)


def _default(key: str):
    """The Scenario field's default: what a scenario file that leaves `key` out gets."""
    return next(f.default for f in fields(Scenario) if f.name == key)


def _settings(check: _Checker, node, raw: dict) -> EngineSettings:
    """The file's engine settings, checked by the engine's own rules; a broken one is told at its key's line."""
    given = {f.name: raw[f.name] for f in fields(EngineSettings) if f.name in _SCALARS and f.name in raw}
    try:
        return EngineSettings(**given)
    except SettingError as error:
        check.fail(node(error.key), str(error))


def _step(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _arrivals(check: _Checker, node, arrivals, num_requests: int) -> list[int]:
    """One engine step per request; `[s]` means every request arrives at step s; `{every: N}` staggers them."""
    if isinstance(arrivals, dict) and set(arrivals) == {"every"} and _step(arrivals["every"]):
        arrivals = [i * arrivals["every"] for i in range(num_requests)]
    if not isinstance(arrivals, list) or not arrivals or not all(_step(a) for a in arrivals):
        check.fail(node, f"arrivals must be a list of engine steps in 0..{MAX_COUNT} or {{every: N}}")
    if len(arrivals) == 1:
        return arrivals * num_requests
    if len(arrivals) != num_requests:
        check.fail(node, f"arrivals lists {len(arrivals)} steps for {num_requests} requests: give one step per "
                         f"request, one step for all ([0]: all at once), or {{every: N}}")
    return arrivals


def _capture_sizes(check: _Checker, node, sizes) -> tuple[int, ...] | None:
    if sizes is None:
        return None
    if not isinstance(sizes, list) or not sizes:
        check.fail(node, "capture_sizes must be a non-empty list of positive integers")
    if not all(_step(s) and s >= 1 for s in sizes):
        check.fail(node, f"capture_sizes must be positive integers up to {MAX_COUNT}, got {show(sizes)}")
    if sizes != sorted(set(sizes)):
        check.fail(node, f"capture_sizes must be strictly increasing, got {show(sizes)}")
    return tuple(sizes)


def _modes(check: _Checker, node, raw: dict) -> list[str]:
    modes = raw.get("modes", list(MODES))
    if isinstance(modes, str):
        modes = [m.strip() for m in modes.split(",")]
    if not isinstance(modes, list) or not modes:
        check.fail(node("modes"), "modes must be a non-empty list of mode names")
    for m in modes + ([raw["drafter_mode"]] if "drafter_mode" in raw else []):
        if not isinstance(m, str) or m not in MODES:
            check.fail(node("modes") if m in modes else node("drafter_mode"),
                       f"unknown mode {show(m)} (known: {', '.join(MODES)})")
    return modes


def _window(check: _Checker, node, sw) -> tuple[int, tuple[int, ...]]:
    if sw is None:
        return 0, ()
    if not (isinstance(sw, dict) and set(sw) == {"size", "layers"} and _step(sw["size"])
            and sw["size"] >= 1 and isinstance(sw["layers"], list) and all(_step(x) for x in sw["layers"])):
        check.fail(node, "sliding_window must be {size: N >= 1, layers: [layer indices]}")
    return sw["size"], tuple(sw["layers"])


def _prompts_path(check: _Checker, node, scenario_path: Path, name: str) -> Path:
    try:
        return (scenario_path.parent / name).resolve()
    except (OSError, ValueError, RuntimeError):     # NUL bytes, symlink loops
        check.fail(node, f"prompts: {show(name)} is not a usable path")
