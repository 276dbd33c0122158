"""Scenario files: YAML, validated on load with file, line and reason.

A scenario fixes everything a run depends on except the model and the modes
given on the command line: prompts, batch composition and arrivals, engine
limits, sampling, graph capture sizes and the tolerances of the verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from parity.analysis.tolerances import Tolerances
from parity.errors import ParityInputError
from parity.graphs.modes import MODES


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    prompts_file: str
    prompts: tuple[tuple[str, str], ...]            # (id, text)
    num_requests: int
    arrivals: tuple[int, ...]                       # engine step of each request's arrival
    max_tokens: int = 32
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 256
    num_speculative_tokens: int = 3
    temperature: float = 0.0
    seed: int = 0
    block_size: int = 16
    max_model_len: int = 256
    capture_sizes: tuple[int, ...] | None = None
    modes: tuple[str, ...] = MODES
    drafter_mode: str | None = None
    sliding_window: int = 0
    sliding_window_layers: tuple[int, ...] = ()
    shared_drafter_pool: bool = False
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
    "num_speculative_tokens": (int, "an integer in 1..32"),
    "temperature": ((int, float), "a number >= 0"),
    "seed": (int, "an integer"),
    "block_size": (int, "a positive integer"),
    "max_model_len": (int, "a positive integer"),
    "drafter_mode": (str, "a mode name"),
    "shared_drafter_pool": (bool, "true or false"),
}
_LISTS = {"arrivals", "capture_sizes", "modes", "sliding_window"}
_TOLERANCE_KEYS = {f.name: f.type for f in fields(Tolerances)}


class _Checker:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, node, reason: str):
        line = node.start_mark.line + 1 if node is not None else 1
        raise ParityInputError(f"{self.path}:{line}: {reason}")


def _value(node):
    return yaml.safe_load(yaml.serialize(node))


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate a scenario file; every problem is one ParityInputError line."""
    path = Path(path)
    if not path.is_file():
        raise ParityInputError(f"{path}: scenario file not found")
    check = _Checker(path)
    try:
        root = yaml.compose(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise ParityInputError(f"{path}:{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(root, yaml.MappingNode):
        check.fail(root, "a scenario must be a mapping of keys to values")
    raw: dict = {}
    nodes: dict = {}
    for key_node, value_node in root.value:
        key = key_node.value
        if key in nodes:
            check.fail(key_node, f"duplicate key {key!r}")
        nodes[key] = (key_node, value_node)
        if key == "tolerances":
            raw[key] = _tolerances(check, value_node)
        elif key in _SCALARS:
            kind, expected = _SCALARS[key]
            value = _value(value_node)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                check.fail(value_node, f"{key} must be {expected}, got {value!r}")
            raw[key] = value
        elif key in _LISTS:
            raw[key] = _value(value_node)
        else:
            known = sorted(list(_SCALARS) + list(_LISTS) + ["tolerances"])
            check.fail(key_node, f"unknown key {key!r} (known: {', '.join(known)})")
    return _build(path, check, raw, nodes)


def _tolerances(check: _Checker, node) -> Tolerances:
    if not isinstance(node, yaml.MappingNode):
        check.fail(node, "tolerances must be a mapping")
    values = {}
    for key_node, value_node in node.value:
        key = key_node.value
        if key not in _TOLERANCE_KEYS:
            check.fail(key_node, f"unknown tolerance {key!r} (known: {', '.join(_TOLERANCE_KEYS)})")
        value = _value(value_node)
        if key in ("require_token_parity", "require_draft_parity"):
            if not isinstance(value, bool):
                check.fail(value_node, f"{key} must be true or false, got {value!r}")
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            check.fail(value_node, f"{key} must be a number >= 0, got {value!r}")
        values[key] = value
    return Tolerances(**values)


def _positive(check, nodes, raw, key):
    if key in raw and raw[key] < 1:
        check.fail(nodes[key][1], f"{key} must be a positive integer, got {raw[key]}")


def _build(path: Path, check: _Checker, raw: dict, nodes: dict) -> Scenario:
    node = lambda key: nodes[key][1] if key in nodes else None  # noqa: E731
    if "prompts" not in raw:
        check.fail(None, "missing required key 'prompts'")
    for key in ("num_requests", "max_tokens", "max_num_seqs", "max_num_batched_tokens", "block_size",
                "max_model_len"):
        _positive(check, nodes, raw, key)
    k = raw.get("num_speculative_tokens", 3)
    if not 1 <= k <= 32:
        check.fail(node("num_speculative_tokens"), f"num_speculative_tokens must be in 1..32, got {k}")
    if raw.get("temperature", 0.0) < 0:
        check.fail(node("temperature"), f"temperature must be >= 0, got {raw['temperature']}")

    prompts_path = (path.parent / raw["prompts"]).resolve()
    prompts = _read_prompts(check, node("prompts"), prompts_path)
    num_requests = raw.get("num_requests", len(prompts))

    arrivals = _arrivals(check, node("arrivals"), raw.get("arrivals", [0]), num_requests)
    sizes = _capture_sizes(check, node("capture_sizes"), raw.get("capture_sizes"))
    modes = _modes(check, node, raw)
    window, window_layers = _window(check, node("sliding_window"), raw.get("sliding_window"))

    values = {key: raw[key] for key in ("max_tokens", "max_num_seqs", "max_num_batched_tokens",
                                        "num_speculative_tokens", "seed", "block_size", "max_model_len",
                                        "drafter_mode", "shared_drafter_pool", "description") if key in raw}
    if "temperature" in raw:
        values["temperature"] = float(raw["temperature"])
    return Scenario(
        name=raw.get("name", path.stem), path=str(path), prompts_file=str(prompts_path),
        prompts=tuple(prompts), num_requests=num_requests, arrivals=tuple(arrivals),
        capture_sizes=sizes, modes=tuple(modes), sliding_window=window,
        sliding_window_layers=window_layers, tolerances=raw.get("tolerances", Tolerances()), **values)


def _arrivals(check: _Checker, node, arrivals, num_requests: int) -> list[int]:
    if isinstance(arrivals, dict) and set(arrivals) == {"every"} and isinstance(arrivals["every"], int) \
            and arrivals["every"] >= 0:
        arrivals = [i * arrivals["every"] for i in range(num_requests)]
    if not isinstance(arrivals, list) or not arrivals or not all(
            isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in arrivals):
        check.fail(node, "arrivals must be a list of engine steps >= 0 or {every: N}")
    return [arrivals[i] if i < len(arrivals) else arrivals[-1] for i in range(num_requests)]


def _capture_sizes(check: _Checker, node, sizes) -> tuple[int, ...] | None:
    if sizes is None:
        return None
    if not isinstance(sizes, list) or not sizes:
        check.fail(node, "capture_sizes must be a non-empty list of positive integers")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        check.fail(node, f"capture_sizes must be positive integers, got {sizes}")
    if sizes != sorted(set(sizes)):
        check.fail(node, f"capture_sizes must be strictly increasing, got {sizes}")
    return tuple(sizes)


def _modes(check: _Checker, node, raw: dict) -> list[str]:
    modes = raw.get("modes", list(MODES))
    if isinstance(modes, str):
        modes = [m.strip() for m in modes.split(",")]
    if not isinstance(modes, list) or not modes:
        check.fail(node("modes"), "modes must be a non-empty list of mode names")
    for m in modes + ([raw["drafter_mode"]] if "drafter_mode" in raw else []):
        if m not in MODES:
            check.fail(node("modes") if m in modes else node("drafter_mode"),
                       f"unknown mode {m!r} (known: {', '.join(MODES)})")
    return modes


def _window(check: _Checker, node, sw) -> tuple[int, tuple[int, ...]]:
    if sw is None:
        return 0, ()
    if not (isinstance(sw, dict) and set(sw) == {"size", "layers"} and isinstance(sw["size"], int)
            and sw["size"] >= 1 and isinstance(sw["layers"], list)
            and all(isinstance(x, int) and x >= 0 for x in sw["layers"])):
        check.fail(node, "sliding_window must be {size: N >= 1, layers: [layer indices]}")
    return sw["size"], tuple(sw["layers"])


def _read_prompts(check: _Checker, node, path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        check.fail(node, f"prompts file {path} not found")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompts.append((str(item.get("id", f"p{len(prompts)}")), str(item["text"])))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
            raise ParityInputError(f"{path}:{number}: expected a JSON object with a 'text' field") from None
    if not prompts:
        raise ParityInputError(f"{path}:1: the prompt set is empty")
    return prompts
