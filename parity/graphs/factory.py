"""Executors for a mode: eager, or graph managers on a backend."""

from __future__ import annotations

from parity.errors import ParityInputError
from parity.graphs.descriptor import EagerExecutor


def build_executors(engine, mode: str, backend: str, scenario, faults=()) -> dict:
    """Install the target's and drafter's executors for `mode` on `engine`; return a capture summary."""
    if mode == "eager":
        engine.target_executor = EagerExecutor()
        engine.drafter_executor = EagerExecutor()
        return {}
    raise ParityInputError(f"mode {mode!r} is not available yet")
