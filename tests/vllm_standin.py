"""A stand-in for vLLM's CUDAGraphWrapper and forward context, with the same interface.

Follows vllm/compilation/cuda_graph.py: the wrapper reads the batch
descriptor and runtime mode from the forward context, runs the runnable
directly when the mode is not its own, captures on the first call per
descriptor inside `torch.cuda.graph(cudagraph, pool=..., stream=...)`, holds
the output weakly, and replays afterwards, returning the weakly held output.
`graphs` is torch.cuda on a GPU and parity.audit.emulated on the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum

import torch

from parity.audit import emulated


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclasses.dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@dataclasses.dataclass
class ForwardContext:
    attn_metadata: dict
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


def weak_ref_tensors(graphs, output):
    if graphs is emulated:
        return emulated.weak_ref_tensors(output)
    from parity.audit.aliases import non_owning
    return non_owning(output) if isinstance(output, torch.Tensor) else tuple(non_owning(t) for t in output)


@dataclasses.dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: object | None = None
    output: object | None = None


class CUDAGraphWrapper:
    def __init__(self, runnable, vllm_config, runtime_mode: CUDAGraphMode, cudagraph_options=None, graphs=emulated):
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.graphs = graphs
        self.graph_pool = graphs.graph_pool_handle()
        # NOTE: vLLM captures on its own current stream, never the legacy default one (CUDA refuses that).
        self.stream = torch.cuda.Stream() if graphs is torch.cuda else None
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __call__(self, *args, **kwargs):
        forward_context = get_forward_context()
        batch_descriptor = forward_context.batch_descriptor
        mode = forward_context.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        entry = self.concrete_cudagraph_entries.setdefault(batch_descriptor, CUDAGraphEntry(batch_descriptor))
        if entry.cudagraph is None:
            cudagraph = self.graphs.CUDAGraph()
            with self.graphs.graph(cudagraph, pool=self.graph_pool, stream=self.stream):
                output = self.runnable(*args, **kwargs)
                output = weak_ref_tensors(self.graphs, output)
            entry.output = weak_ref_tensors(self.graphs, output)
            entry.cudagraph = cudagraph
            return output
        entry.cudagraph.replay()
        return entry.output
