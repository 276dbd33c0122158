"""How graphs are captured and replayed: the choices a graph runner makes once, at start-up.

`executor` is the class that dispatches, captures and replays each owner's
forwards (a graph runner; a variant overrides one of its steps).

Captures go largest first into a pool per owner; the drafter gets a dedicated
pool unless `shared_drafter_pool` (seed 004: sharing lets drafter temporaries
land on live target outputs). `detached_capture_metadata` lists owners whose
graphs are captured on a copy of the dummy metadata instead of views of their
persistent buffers (seed 000: capture ran with another metadata object than
replay refreshes).
"""

from __future__ import annotations

from dataclasses import dataclass

from parity.graphs.manager import GraphExecutor


@dataclass(frozen=True)
class CapturePolicy:
    # The class that dispatches, captures and replays each owner's forwards.
    executor: type[GraphExecutor] = GraphExecutor
    shared_drafter_pool: bool = False
    detached_capture_metadata: tuple[str, ...] = ()
    # Outputs held weakly, as vLLM holds them: their memory returns to the pool after capture.
    weak_outputs: bool = True
    # Forward outputs (by name, `Forward.outputs`) handed out as copies after every replay, as an engine that
    # copies results out of graph memory does; the bisector's output-lifetime experiment sets it.
    copied_outputs: tuple[str, ...] = ()
