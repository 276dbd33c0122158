"""vLLM's CUDAGraphWrapper (vllm/compilation/cuda_graph.py), same control flow, for torch.cuda or the emulated API.

The wrapper reads the runtime mode and batch descriptor from the forward
context; in another mode it runs its runnable eagerly. Per descriptor it
captures once, on its own stream into a shared pool, converting the output to
weak references inside the capture block when `weak_ref_output` (the last
piece, or a FULL graph), and always holds the entry's output weakly; later
calls replay and return that weakly held output.
"""

from __future__ import annotations

import dataclasses

import torch

from examples.vllm_shaped.forward_context import BatchDescriptor, CUDAGraphMode, get_forward_context
from parity.audit import emulated
from parity.audit.aliases import non_owning


def weak_ref_tensors(graphs, outputs):
    """vLLM's weak_ref_tensors: aliases that keep none of the memory (the emulated API has its own)."""
    if graphs is emulated:
        return emulated.weak_ref_tensors(outputs)
    if isinstance(outputs, torch.Tensor):
        return non_owning(outputs)
    return type(outputs)(non_owning(t) for t in outputs)


@dataclasses.dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: object | None = None
    output: object | None = None


class CUDAGraphWrapper:
    def __init__(self, runnable, runtime_mode: CUDAGraphMode, graphs, graph_pool, weak_ref_output: bool = True):
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.graphs = graphs
        self.graph_pool = graph_pool
        self.weak_ref_output = weak_ref_output
        # NOTE: vLLM captures on its current (non-default) stream; CUDA refuses the legacy default one.
        self.stream = torch.cuda.Stream() if graphs is torch.cuda else None
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __call__(self, *args, **kwargs):
        context = get_forward_context()
        descriptor, mode = context.batch_descriptor, context.cudagraph_runtime_mode
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        entry = self.concrete_cudagraph_entries.setdefault(descriptor, CUDAGraphEntry(descriptor))
        if entry.cudagraph is None:
            cudagraph = self.graphs.CUDAGraph()
            with self.graphs.graph(cudagraph, pool=self.graph_pool, stream=self.stream):
                output = self.runnable(*args, **kwargs)
                if self.weak_ref_output:
                    # the strong output dies here: its memory goes back to the pool at once
                    output = weak_ref_tensors(self.graphs, output)
            entry.output = weak_ref_tensors(self.graphs, output)
            entry.cudagraph = cudagraph
            return output
        entry.cudagraph.replay()
        return entry.output
