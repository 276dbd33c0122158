"""A stand-in for vLLM's CUDAGraphWrapper and forward context, with vLLM's interface.

The pieces are the example engine's (examples/vllm_shaped: forward context,
wrapper); only the constructor differs, taking vLLM's arguments
`(runnable, vllm_config, runtime_mode, cudagraph_options)` and drawing the
wrapper's own graph pool. `graphs` is torch.cuda on a GPU and
parity.audit.emulated on the CPU.
"""

from __future__ import annotations

from examples.vllm_shaped import cuda_graph
from examples.vllm_shaped.forward_context import (BatchDescriptor, CUDAGraphMode, ForwardContext,
                                                  get_forward_context, set_forward_context)
from parity.audit import emulated

__all__ = ["BatchDescriptor", "CUDAGraphMode", "CUDAGraphWrapper", "ForwardContext", "emulated",
           "get_forward_context", "set_forward_context"]


class CUDAGraphWrapper(cuda_graph.CUDAGraphWrapper):
    def __init__(self, runnable, vllm_config, runtime_mode: CUDAGraphMode, cudagraph_options=None, graphs=emulated):
        super().__init__(runnable, runtime_mode, graphs, graphs.graph_pool_handle())
        self.vllm_config = vllm_config
