"""Executors for a mode: eager, or graph executors on a backend, captured at start-up."""

from __future__ import annotations

import torch

from parity.errors import ParityInputError
from parity.graphs.descriptor import EagerExecutor
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.manager import GraphExecutor, PaddedEagerExecutor, restore_tensors, snapshot_tensors
from parity.graphs.modes import MODES, default_capture_sizes, validate_capture_sizes


def make_backend(name: str, device: torch.device):
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ParityInputError("--backend cuda: CUDA is not available on this machine")
        from parity.graphs.cuda import CudaBackend
        return CudaBackend(device)
    if name == "emulated":
        from parity.graphs.emulated import EmulatedBackend
        return EmulatedBackend(device)
    raise ParityInputError(f"unknown backend {name!r} (known: cuda, emulated)")


def dispatchers(engine, mode: str, drafter_mode: str | None, capture_sizes) -> tuple[Dispatcher, Dispatcher]:
    cfg = engine.config
    for m in (mode, drafter_mode or mode):
        if m not in MODES:
            raise ParityInputError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    sizes = validate_capture_sizes(capture_sizes) if capture_sizes is not None \
        else default_capture_sizes(cfg.max_num_batched_tokens)
    q = cfg.num_speculative_tokens + 1
    target = Dispatcher(mode, sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens, {"verify": q})
    drafter = Dispatcher(drafter_mode or mode, sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                         {"draft_prefill": q, "draft_step": 1})
    return target, drafter


def install_padded_reference(engine, mode: str, capture_sizes=None, drafter_mode: str | None = None) -> None:
    """Make `engine` the strict reference of `mode`: same padding, eager execution."""
    target, drafter = dispatchers(engine, mode, drafter_mode, capture_sizes)
    engine.target_executor = PaddedEagerExecutor(target)
    engine.drafter_executor = PaddedEagerExecutor(drafter)


def install_graphs(engine, mode: str, backend_name: str, capture_sizes=None, drafter_mode: str | None = None,
                   shared_drafter_pool: bool = False, weak_outputs: bool = True) -> dict:
    """Capture every graph `mode` needs on `engine` and install the executors; returns a summary."""
    if mode == "eager" and (drafter_mode or "eager") == "eager":
        engine.target_executor = EagerExecutor()
        engine.drafter_executor = EagerExecutor()
        return {}
    backend = make_backend(backend_name, engine.device)
    target_disp, drafter_disp = dispatchers(engine, mode, drafter_mode, capture_sizes)
    cfg = engine.config
    faults = cfg.faults
    if "shared-pool-alias" in faults:
        # FAULT: the drafter captures into the target's pool.
        shared_drafter_pool = True
    target_pool = backend.new_pool("target")
    drafter_pool = target_pool if shared_drafter_pool else backend.new_pool("drafter")
    registries = [engine.target.buffers] + ([engine.proposer.buffers] if engine.proposer else [])

    def live_tensors():
        tensors = [t for r in registries for _, t in r.items()] + engine.target.kv_cache.tensors()
        if engine.proposer:
            tensors += engine.proposer.kv_cache.tensors()
        return tensors

    snapshot = lambda: (live_tensors(), snapshot_tensors(live_tensors()))  # noqa: E731
    restore = lambda saved: restore_tensors(*saved)  # noqa: E731

    target_exec = GraphExecutor("target", mode, backend, target_pool, target_disp, registries[:1], weak_outputs)
    target_dummy = lambda phase, t, r: engine.target.builder.build_dummy(t, r)  # noqa: E731
    counts = {"verify": target_exec.capture_phase("verify", engine.target.forward, target_dummy,
                                                  cfg.max_num_batched_tokens, snapshot, restore)}
    engine.target_executor = target_exec
    summary = {"backend": backend.name, "capture_sizes": list(target_disp.token_sizes),
               "request_sizes": list(target_disp.req_sizes), "drafter_mode": drafter_mode or mode,
               "shared_drafter_pool": shared_drafter_pool}
    if engine.proposer is not None:
        proposer = engine.proposer
        drafter_exec = GraphExecutor("drafter", drafter_mode or mode, backend, drafter_pool, drafter_disp,
                                     registries[1:], weak_outputs)

        def drafter_dummy(phase, t, r):
            meta = proposer.builder.build_dummy(t, r)
            if "capture-without-metadata" in faults:
                # FAULT: capture runs with placeholder metadata, not views of the buffers.
                # NOTE: the placeholders are kept alive, as a dummy-metadata builder keeps
                # its buffers: a CUDA graph does not own what it reads, and freed
                # placeholders would turn a wrong-value bug into out-of-bounds reads.
                meta = detached_copy(meta)
                drafter_exec.placeholders.append(meta)
            proposer.buffers["sample_indices"].zero_()
            proposer.buffers["draft_step"].zero_()
            return meta

        counts["draft_prefill"] = drafter_exec.capture_phase(
            "draft_prefill", proposer.prefill_forward, drafter_dummy, cfg.max_num_batched_tokens, snapshot, restore)
        counts["draft_step"] = drafter_exec.capture_phase(
            "draft_step", proposer.step_forward, drafter_dummy, cfg.max_num_seqs, snapshot, restore)
        engine.drafter_executor = drafter_exec
    summary["graphs"] = counts
    return summary


def detached_copy(meta):
    """The same metadata values in fresh tensors that nothing will ever update."""
    import dataclasses

    fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
    return type(meta)(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})


def build_executors(engine, mode: str, backend: str, scenario, faults=()) -> dict:
    """Install the executors a scenario asks for in `mode`."""
    return install_graphs(engine, mode, backend, scenario.capture_sizes, scenario.drafter_mode,
                          scenario.shared_drafter_pool)
