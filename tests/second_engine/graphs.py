"""Graphs by hand: torch.cuda's graph API on a GPU, parity.audit's emulated stand-in on the CPU."""

from __future__ import annotations

import torch

from parity.audit import emulated


def graph_api(device: torch.device):
    """The module whose CUDAGraph / graph / graph_pool_handle this engine uses."""
    return torch.cuda if device.type == "cuda" else emulated


def warm_up(api, fn, *args) -> None:
    """Run fn twice before capturing it (CUDA: on a side stream, so lazy initialisation stays out of the
    capture). On the CPU too: whatever the warm-up moves (a counter the forward advances) moves on both
    backends, so the engine captures the same graphs on each."""
    if api is not torch.cuda:
        for _ in range(2):
            fn(*args)
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def capture(api, pool, fn, *args):
    """(graph, outputs) of fn(*args) captured into `pool`."""
    graph = api.CUDAGraph()
    with api.graph(graph, pool=pool):
        outputs = fn(*args)
    return graph, outputs


class _NonOwning:
    def __init__(self, t: torch.Tensor):
        self.__cuda_array_interface__ = {"shape": (t.numel() * t.element_size(),), "typestr": "|u1",
                                         "data": (t.data_ptr(), False), "version": 2, "strides": None}


def weak_ref(api, outputs: tuple) -> tuple:
    """Outputs held without their memory (vLLM's weak_ref_tensors): the pool may hand it out again."""
    if api is not torch.cuda:
        return api.weak_ref_tensors(outputs)
    return tuple(torch.as_tensor(_NonOwning(t), device=t.device).view(t.dtype).view(t.shape) for t in outputs)
