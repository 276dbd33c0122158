"""vLLM's forward context (vllm/forward_context.py), reduced to what attention and the graph wrapper read.

The runner sets it around every forward (eager, capture and replay alike);
attention finds its metadata there, and CUDAGraphWrapper finds the runtime
mode and the batch descriptor that keys its graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclasses.dataclass(frozen=True)
class BatchDescriptor:
    """The key of a graph, as vLLM's: padded token count and whether every request has the same query length."""
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False


@dataclasses.dataclass
class ForwardContext:
    attn_metadata: dict | None                # layer name -> AttentionMetadata (one object for all layers)
    batch_descriptor: BatchDescriptor | None
    cudagraph_runtime_mode: CUDAGraphMode


_CONTEXT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    assert _CONTEXT is not None, "forward context is not set"
    return _CONTEXT


@contextlib.contextmanager
def set_forward_context(attn_metadata, batch_descriptor=None, cudagraph_runtime_mode=CUDAGraphMode.NONE):
    global _CONTEXT
    previous, _CONTEXT = _CONTEXT, ForwardContext(attn_metadata, batch_descriptor, cudagraph_runtime_mode)
    try:
        yield
    finally:
        _CONTEXT = previous
