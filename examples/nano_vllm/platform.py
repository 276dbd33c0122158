"""What nano-vllm's runner expects of the machine, stood in for the length of a block.

nano-vllm's `ModelRunner` opens an NCCL process group, moves every per-step
tensor to the GPU (`pin_memory=True`, `.cuda(non_blocking=True)`), sizes its KV
cache from `torch.cuda.mem_get_info()` and captures with `torch.cuda.CUDAGraph`.
`platform()` makes those calls mean their CPU counterparts for the length
of a block: graphs are `parity.audit.emulated`'s (same names, same semantics),
"cuda" is the CPU, the process group has one rank. On a GPU machine the process
group is stood in for (one rank, no port opened) and `mem_get_info` describes
a card on which nano-vllm's sizing rule (90% of the card, less what is used)
leaves KV_BYTES for the cache: on the real card the cache takes 90% of the
GPU and starves every other test sharing it. Either way the
default device and dtype the runner sets are restored, even when it raises.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from parity.audit import emulated

KV_BYTES = 8 << 20          # what mem_get_info reports free for the KV cache


def _patches(cuda: bool) -> dict:
    group = {(dist, "init_process_group"): lambda *a, **k: None, (dist, "destroy_process_group"): lambda: None,
             (dist, "get_rank"): lambda *a: 0, (dist, "get_world_size"): lambda *a: 1,
             (dist, "barrier"): lambda *a, **k: None}
    if cuda:
        def bounded(*_):        # the card nano-vllm's formula reads: KV_BYTES left at its 90% utilisation
            stats = torch.cuda.memory_stats()
            card = int((KV_BYTES + stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]) / 0.9)
            return card + 1, card + 1
        return {**group, (torch.cuda, "mem_get_info"): bounded}
    tensor, set_default_device = torch.tensor, torch.set_default_device

    def cpu_tensor(*args, pin_memory=False, **kwargs):
        return tensor(*args, **kwargs)
    nothing = lambda *a, **k: None  # noqa: E731
    return {**group, (torch, "tensor"): cpu_tensor,
            (torch, "set_default_device"): lambda d: set_default_device("cpu" if str(d).startswith("cuda") else d),
            (torch.Tensor, "cuda"): lambda self, *a, **k: self,
            (torch.cuda, "set_device"): nothing, (torch.cuda, "empty_cache"): nothing,
            (torch.cuda, "reset_peak_memory_stats"): nothing, (torch.cuda, "synchronize"): nothing,
            (torch.cuda, "mem_get_info"): lambda *a: (KV_BYTES, KV_BYTES),
            (torch.cuda, "memory_stats"): lambda *a: {"allocated_bytes.all.peak": 0,
                                                      "allocated_bytes.all.current": 0},
            (torch.cuda, "CUDAGraph"): emulated.CUDAGraph, (torch.cuda, "graph"): emulated.graph,
            (torch.cuda, "graph_pool_handle"): emulated.graph_pool_handle}


@contextlib.contextmanager
def platform():
    """The stand-ins above for the block (restored after it, with the default device and dtype)."""
    patches = _patches(torch.cuda.is_available())
    saved = {key: getattr(*key) for key in patches}
    device, dtype = torch.get_default_device(), torch.get_default_dtype()
    try:
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
        torch.set_default_device(device)
        torch.set_default_dtype(dtype)
