"""A graph mode whose engine raised while its run went on: a verdict of that mode, not an internal error.

Eager runs the same engine code on the same schedule; when only a graph mode
raises (an engine assertion tripped by values a stale graph wrote, an index out
of range, ...), the graph bug showed as an exception. The mode stops there and
drifts, naming the engine's line; the other modes still run and the bisection
looks for the forward that first parted from eager. An exception raised in the
harness's own code, or in eager, is not a graph bug and still propagates.
"""

from __future__ import annotations

from parity.graphs.capture_errors import engine_source

# Lines in these parts of the tool are the tool's own: an exception there is an internal error, never a verdict.
_TOOL = ("parity/harness/", "parity/analysis/", "parity/report/", "parity/commands/", "parity/diagnose/",
         "parity/audit/", "parity/diagnosis/", "parity/graphs/", "parity/faults/peek")


def engine_crash(error: BaseException, step: int) -> dict | None:
    """What a graph mode's run record says of `error`, raised at engine step `step`; None when the innermost
    frame outside torch is the tool's own (then it is not the engine's exception to report)."""
    source = engine_source(error.__traceback__)
    if source is None or source.file.startswith(_TOOL):
        return None
    return {"step": step, "error": f"{type(error).__name__}: {error}".strip(), "source": source.name,
            "function": source.function, "code": source.code}

