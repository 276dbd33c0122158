"""What the declared static inputs lacked at capture: fields that were None then (a forward context
captured with `attn_metadata=None`), so a diagnosis can say the graph was captured without them.

Only the declared inputs are looked at, one or two attributes deep: a forward
context is `static['forward_context']`, its metadata a field of it, its
per-layer entries one level further.
"""

from __future__ import annotations

import dataclasses

from parity.graphs.roles import ATTR, ITEM, MISSING, Path, resolve, roots_of

MAX_FIELDS = 64


def _fields(obj):
    if isinstance(obj, dict):
        return [(ITEM, k, v) for k, v in list(obj.items())[:MAX_FIELDS] if isinstance(k, str)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(ATTR, f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if hasattr(obj, "__dict__") and not callable(obj):
        return [(ATTR, k, v) for k, v in list(vars(obj).items())[:MAX_FIELDS] if not k.startswith("_")]
    return []


def none_at_capture(static_inputs: dict | None) -> list[Path]:
    """Paths under the declared static inputs (two levels deep) that hold None now (at capture)."""
    if not static_inputs:
        return []
    found = []
    for name, value in roots_of(None, (), {}, static_inputs)["static"].items():
        for kind, key, child in _fields(value):
            path = Path("static", ((ITEM, name), (kind, key)))
            if child is None:
                found.append(path)
            for kind2, key2, leaf in _fields(child) if isinstance(child, dict) else []:
                if leaf is None:
                    found.append(Path("static", path.steps + ((kind2, key2),)))
    return found


def capture_hints(paths: list[Path], static_inputs: dict | None) -> list[str]:
    """One line per path that was None at capture and holds something now."""
    if not paths:
        return []
    roots = roots_of(None, (), {}, static_inputs)
    hints = []
    for path in paths:
        live = resolve(path, roots)
        if live is not None and live is not MISSING:
            hints.append(f"{path} was None when the graph was captured and is a {type(live).__name__} now: the "
                         "capture ran without it (a forward context set without metadata), so the graph cannot "
                         "read it; capture inside the context the replays run in")
    return hints
