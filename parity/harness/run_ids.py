"""Names of run folders under reports/ and of other files named after a model or a scenario.

A run id is `<timestamp>-<model>-<scenario>-<suffix>`: the timestamp keeps
`ls reports/` in time order; the random suffix keeps two runs started in the
same second (CI shards, a loop in a shell) from claiming the same folder.
Names come from users (a scenario's `name`, `--model`): they are cut down to
characters that are safe in one path component, so a name such as `../x`
can never place a file outside the folder meant for it.
"""

from __future__ import annotations

import datetime as _dt
import re
import secrets

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_PART = 60      # characters kept of each name: a run id stays far below NAME_MAX (255 bytes)


def slug(name: str, fallback: str = "unnamed") -> str:
    """`name` as one safe path component: runs of other characters become '-', no leading '.' or '-'."""
    text = _UNSAFE.sub("-", str(name)).strip(".-")[:MAX_PART].strip(".-")
    return text or fallback


def unique_suffix() -> str:
    """Six random hex digits: two runs in the same second collide once in 16 million."""
    return secrets.token_hex(3)


def default_run_id(model: str, scenario: str, now: _dt.datetime | None = None) -> str:
    """`<timestamp>-<model>-<scenario>-<suffix>`, the default run folder name under reports/."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{slug(model)}-{slug(scenario)}-{unique_suffix()}"


def run_ids(model: str, scenario: str):
    """Fresh run ids, one per `next()`: the first, then others should a folder of that name appear meanwhile."""
    while True:
        yield default_run_id(model, scenario)
