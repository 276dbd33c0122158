"""The forward context: the live attention metadata of the forward being run.

Like vLLM's `set_forward_context`: the engine sets it around every forward.
Eager code and PIECEWISE attention read it at run time (live metadata); a FULL
graph reads whatever tensors the context held when it was captured.
"""

from __future__ import annotations

import contextlib
import contextvars

_METADATA: contextvars.ContextVar = contextvars.ContextVar("parity_metadata", default=None)
# Set while a piecewise graph is being captured: called at every attention.
ATTENTION_SPLIT: contextvars.ContextVar = contextvars.ContextVar("parity_attention_split", default=None)


def current_metadata():
    return _METADATA.get()


@contextlib.contextmanager
def forward_context(meta):
    token = _METADATA.set(meta)
    try:
        yield meta
    finally:
        _METADATA.reset(token)
