"""The cyclic garbage collector, paused while a graph is captured."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused_gc():
    """No cyclic garbage collection inside a CUDA capture.

    An audited graph and its engine reference each other (graph.replay -> audit
    -> fn -> engine -> graph), so dead ones wait for the cyclic collector; a
    graph destroyed while another capture is open invalidates that capture
    ("operation failed due to a previous error during capture"), whichever
    program's graph it was. vLLM stops the collector during capture too.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
