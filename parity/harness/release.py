"""Runs one after another in bounded memory: each run's engine, KV cache, graphs and pools go before the next.

A run (an engine built, its graphs captured, the scenario run through it)
holds, besides the weights: a KV cache, persistent buffers, captured graphs and
their pools (CUDA keeps a graph's private pool until the graph is destroyed and
the cache emptied) and the cuBLAS workspaces of the streams it used.
`measured(run, device, name, scenario)` calls `run()`, which must drop its
engine before returning (`graphs.factory.uninstall` and letting the engine go
out of scope), then gives everything back (gc, synchronize, cuBLAS workspaces,
empty_cache, as PyTorch's own leak check does) and records, on CUDA:

- `baseline_bytes`: allocated before the run (the weights, after loading),
- `peak_bytes`: the most allocated at once during the run,
- `leftover_bytes`: allocated after the clean-up minus the baseline (0 when
  the run gave everything back),
- `peak_reserved_bytes`: the most the caching allocator reserved at once
  (graph pools stay reserved while their captures' temporaries are free: this
  is the figure the memory plan predicts),
- `reserved_bytes`: what the caching allocator still reserves after it.

An OutOfMemoryError inside the run becomes one line (OutOfDeviceMemory, exit
2) naming the run, the figures and the knobs to lower; it is raised after the
clean-up, outside the handler, so the failed run's traceback (which holds its
engine) is gone by then.
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch

from parity.errors import OutOfDeviceMemory

GIB = 1 << 30


def reclaim(device: torch.device) -> None:
    """Collect what the last run dropped and hand the device memory back to the driver."""
    gc.collect()
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    # NOTE: cuBLAS keeps a workspace per (handle, stream), allocated through the caching
    # allocator; every capture's side stream adds one. Cleared here, as PyTorch's own
    # CUDA leak check does, so a run leaves nothing allocated behind it.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


@contextlib.contextmanager
def frozen_heap():
    """Leave what is alive now (modules, weights) out of the collections `reclaim` runs between runs.

    A full collection walks every object of torch and transformers (~0.2 s a call
    on a small machine, twice a run); frozen, it walks only what the runs made.
    Inside a frozen heap (a caller's, or a forked child's) it changes nothing.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measured(run, device: torch.device, name: str, scenario):
    """(run(), memory) where memory is the run's figures on CUDA (None elsewhere); see the module docstring."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    reclaim(device)
    baseline = torch.cuda.memory_allocated(device) if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    failure = None
    try:
        value = run()
    except torch.OutOfMemoryError:
        failure = out_of_memory_line(name, device, baseline, scenario)
    reclaim(device)
    if failure is not None:
        raise OutOfDeviceMemory(failure)
    if not cuda:
        return value, None
    return value, {"device": str(device), "baseline_bytes": baseline,
                   "peak_bytes": torch.cuda.max_memory_allocated(device),
                   "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
                   "leftover_bytes": torch.cuda.memory_allocated(device) - baseline,
                   "reserved_bytes": torch.cuda.memory_reserved(device)}


def out_of_memory_line(name: str, device: torch.device, baseline: int | None, scenario) -> str:
    """One line: which run, what was allocated, reserved and free, and which knobs lower it."""
    figures = ""
    if device.type == "cuda":
        allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        free, total = torch.cuda.mem_get_info(device)
        figures = (f": {allocated / GIB:.1f} GiB allocated ({(baseline or 0) / GIB:.1f} GiB before this run, "
                   f"peak {torch.cuda.max_memory_allocated(device) / GIB:.1f} GiB), {(reserved - allocated) / GIB:.1f}"
                   f" GiB reserved but unallocated, {free / GIB:.1f} of {total / GIB:.1f} GiB free on {device}")
    return (f"out of device memory in {name}{figures}; lower max_num_batched_tokens "
            f"({scenario.max_num_batched_tokens}) or capture_sizes, max_model_len ({scenario.max_model_len}) or "
            f"max_num_seqs ({scenario.max_num_seqs}) in {scenario.path}, or run fewer --modes "
            f"(`parity run --plan` shows what each mode needs)")


class Stopwatch:
    """Named wall-clock intervals: `with watch("capture"): ...`; `watch.seconds` maps names to seconds."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str):
        return _Interval(self, name)


class _Interval:
    def __init__(self, watch: Stopwatch, name: str):
        self.watch, self.name = watch, name

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.watch.seconds[self.name] = round(self.watch.seconds.get(self.name, 0.0)
                                              + time.perf_counter() - self.start, 3)
        return False
