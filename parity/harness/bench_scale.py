"""Real-shape benchmarks (`parity bench scale`): a pair in bf16 on one GPU, forward by forward and run by run.

1. Per forward, for verify, draft_prefill and draft_step at batch 1, 8 and 32
   (uniform decode batches, max_model_len 512): eager and FULL medians
   (interleaved in one loop); one FULL replay's kernels and their summed GPU
   time (torch.profiler: the replay itself when the profiler sees inside the
   graph, else the same forward run eagerly at the graph's padded shape, which
   launches the very kernels the replay does); replay wall time over that GPU
   time (how far launch and sync overhead are gone); the replay queued: the
   mean of many FULL calls issued back to back with one sync at the end, as a
   pipelined engine issues its forwards (each call's host work and launch
   overlapped with the GPU running the one before); and the weight-read floor:
   the bytes of the weights the FULL graph read (every parameter storage its
   capture manifest lists, once and whole, but embedding tables, of which a
   gather reads only its rows; so EAGLE-3's fc, run eagerly before the
   drafter's graphs, is not counted) over the measured bandwidth of a large
   device-to-device copy (read + write counted).
2. A whole run of a scenario in every mode (or a saved run's summary.json):
   wall time, load, capture and run time per mode, analysis; memory per run
   (peak allocated and reserved, leftover) next to the memory plan; each run's
   start and end, the critical path (which run bounded the wall time) and the
   concurrency achieved (the runs' summed time over their wall time).

Computes and returns plain dicts; `parity bench scale` prints and saves them.
"""

from __future__ import annotations

import time

import torch

from parity.graphs.descriptor import PHASES
from parity.harness.bench import forward_engines, interleaved_medians, prepare_forward, sync
from parity.harness.session import run_session

COPY_BYTES = 1 << 31


def hbm_bandwidth(device, nbytes: int = COPY_BYTES, iters: int = 20) -> float:
    """Bytes per second of a device-to-device copy of `nbytes`, reads and writes both counted."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes * iters / seconds


def queued_ms(call, device, iters: int, repeats: int = 5) -> float:
    """Milliseconds per `call()` issued `iters` times back to back, one sync at the end; the median of `repeats`."""
    samples = []
    with torch.no_grad():
        call()
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            for _ in range(iters):
                call()
            sync(device)
            samples.append((time.perf_counter() - start) / iters * 1e3)
    return sorted(samples)[len(samples) // 2]


def device_events(call, device) -> list[tuple[str, float]]:
    """(name, GPU microseconds) of every device-side event of one `call()`, under torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize(device)
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def gpu_kernels(call, device) -> tuple[int, float]:
    """(kernels launched, their summed GPU milliseconds) of one `call()`; memcpy and memset not counted as
    kernels but their time is."""
    events = device_events(call, device)
    kernels = [name for name, _ in events if not name.startswith(("Memcpy", "Memset"))]
    return len(kernels), sum(us for _, us in events) / 1e3


def weight_bytes(pair) -> dict:
    """Bytes of the target's weights and of the head's own (those it does not share with the target)."""
    target = {p.data_ptr(): p.nbytes for p in pair.target.parameters()}
    own = {p.data_ptr(): p.nbytes for p in pair.head.parameters() if p.data_ptr() not in target}
    return {"target": sum(target.values()), "head": sum(own.values())}


def weights_read(entry, pair) -> int:
    """Bytes of the weights one replay of a graph (`entry`) reads: each parameter storage its capture manifest
    lists, once and whole (a fused q/k/v weight is one storage its three projections view), but the embedding
    tables (a gather reads only its rows: a few KB)."""
    tables = {m.weight.untyped_storage().data_ptr() for model in (pair.target, pair.head)
              for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    storages = {}
    for item in entry.manifest:
        if isinstance(item.tensor, torch.nn.Parameter):
            storage = item.tensor.untyped_storage()
            if storage.data_ptr() not in tables:
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def scale_forwards(pair, device, batches=(1, 8, 32), iters: int = 20, max_model_len: int = 512,
                   backend: str = "cuda") -> dict:
    """Eager vs FULL per forward, replay vs kernel time, kernels per forward, the weight-read floor.

    Graphs are captured for exactly the batch timed (capture size = batch): six per engine.
    """
    bandwidth = hbm_bandwidth(device)
    rows = []
    for batch in batches:
        with forward_engines(pair, device, backend, ("eager", "full"), batch, max_model_len,
                             capture_sizes=(batch,)) as engines:
            for phase in PHASES:
                prepared = {mode: prepare_forward(engine, phase, batch) for mode, engine in engines.items()}
                full = prepared["full"]
                medians = interleaved_medians(prepared, device, iters)
                queued = queued_ms(full.call, device, iters)
                try:
                    seen, replay_gpu_ms = gpu_kernels(full.call, device)
                except RuntimeError:      # a profiler that cannot trace graph replays
                    seen, replay_gpu_ms = 0, 0.0
                kernels, eager_gpu_ms = gpu_kernels(full.eager_at_padded_shape, device)
                gpu_ms = replay_gpu_ms if seen else eager_gpu_ms
                read = weights_read(full.executor.entry(full.dispatch), pair)
                floor_ms = read / bandwidth * 1e3
                rows.append({
                    "phase": phase, "batch": batch, "runtime": full.dispatch.runtime_mode,
                    "eager_ms": round(medians["eager"] * 1e3, 3),
                    "full_ms": round(medians["full"] * 1e3, 3),
                    "speedup": round(medians["eager"] / medians["full"], 2),
                    "kernels": kernels, "kernels_seen_in_replay": seen,
                    "gpu_ms": round(gpu_ms, 3), "replay_over_gpu": round(medians["full"] * 1e3 / gpu_ms, 3),
                    "weights_read": read, "floor_ms": round(floor_ms, 3),
                    "full_over_floor": round(medians["full"] * 1e3 / floor_ms, 2),
                    "queued_ms": round(queued, 3), "queued_over_floor": round(queued / floor_ms, 2)})
    return {"bandwidth_gb_s": round(bandwidth / 1e9, 1), "weights": weight_bytes(pair), "max_model_len": max_model_len,
            "iters": iters, "forwards": rows}


def run_figures(summary: dict, wall_seconds: float | None = None) -> dict:
    """A run's breakdown from its summary.json: time (load, capture and run per mode, analysis) and memory."""
    measured = summary.get("measured") or {}
    timing = measured.get("timing") or {}
    runs = timing.get("runs") or {}
    memory = measured.get("memory") or {}
    plan = measured.get("memory_plan") or {}
    concurrency = measured.get("concurrency") or {}
    spans = (concurrency.get("critical_path") or {}).get("spans") or {}
    return {
        "model": summary["model"], "scenario": summary["scenario"], "verdict": summary["verdict"],
        "wall_seconds": wall_seconds,
        "load_seconds": timing.get("load_seconds"), "analysis_seconds": timing.get("analysis_seconds"),
        "bisect_seconds": timing.get("bisect_seconds", 0.0),
        "concurrency": concurrency or None,
        "runs": {name: {**t, **(memory.get(name) or {}), **spans.get(name, {}),
                        "plan_bytes": (plan.get("modes") or {}).get(name, {}).get("total_bytes"),
                        "verdict": summary["modes"].get(name, {}).get("verdict"),
                        "mean_acceptance_length": summary["modes"].get(name, {}).get("mean_acceptance_length")}
                 for name, t in runs.items()},
    }


def time_scale_run(request) -> dict:
    """Run `request` (every mode of its scenario) in this process and return its figures with the wall time."""
    start = time.perf_counter()
    outcome = run_session(request)
    return run_figures(outcome.summary, round(time.perf_counter() - start, 2))
