"""The catalog of injectable faults (filled in by the fault work; empty means a clean engine)."""

from __future__ import annotations

from parity.errors import ParityInputError

FAULTS: dict = {}


def resolve_faults(names) -> tuple:
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        known = ", ".join(FAULTS) or "none yet"
        raise ParityInputError(f"unknown fault {unknown[0]!r} (known: {known})")
    return tuple(FAULTS[n] for n in names)
