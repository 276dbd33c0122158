"""A graph mode whose engine raised while its run went on: a verdict of that mode, not an internal error.

Eager runs the same engine code on the same schedule; when only a graph mode
raises (an engine assertion tripped by values a stale graph wrote, an index out
of range, ...), the graph bug showed as an exception. The mode stops there and
drifts, naming the engine's line; the other modes still run and the bisection
looks for the forward that first parted from eager. An exception raised in the
harness's own code, or in eager, is not a graph bug and still propagates.
"""

from __future__ import annotations

import traceback

import torch

from parity.graphs.capture_errors import engine_source, import_name

# Lines in these parts of the tool are the tool's own: an exception there is an internal error, never a verdict.
_TOOL = ("parity/harness/", "parity/analysis/", "parity/report/", "parity/commands/", "parity/diagnose/",
         "parity/audit/", "parity/diagnosis/", "parity/graphs/", "parity/faults/peek")


def engine_crash(error: BaseException, step: int) -> dict | None:
    """What a graph mode's run record says of `error`, raised at engine step `step`; None when it was raised in
    the tool's own code, or its innermost frame outside torch is (then it is not the engine's exception)."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "out of memory" in str(error):
        return None     # memory is the machine's, not a graph bug: the run's out-of-memory line says what to do
    frames = list(traceback.walk_tb(error.__traceback__))
    raised_in = import_name(frames[-1][0].f_code.co_filename) if frames else ""
    source = engine_source(error.__traceback__)
    if source is None or source.file.startswith(_TOOL) or raised_in.startswith(_TOOL):
        return None     # the tool's own error or verdict (a rank divergence, a wrong graph) raised through the engine
    return {"step": step, "error": f"{type(error).__name__}: {error}".strip(), "source": source.name,
            "function": source.function, "code": source.code}

