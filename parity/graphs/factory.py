"""Install a mode's executors on an engine: eager, graphs captured at start-up, or the padded reference.

The engine is reached only through its owners (`engine.owners()`): each owner
names its buffers, KV cache, forwards (phase, function, largest batch, uniform
query length) and the inert metadata its graphs are captured with, and holds
the executor its forwards run through.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from parity.errors import ParityInputError
from parity.graphs.capacity import check_capacity
from parity.graphs.cuda import CudaBackend
from parity.graphs.descriptor import EagerExecutor
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.emulated import EmulatedBackend
from parity.graphs.manager import GraphExecutor, PaddedEagerExecutor, restore_tensors, snapshot_tensors
from parity.graphs.modes import EAGER, MODES, default_capture_sizes, validate_capture_sizes
from parity.graphs.policy import CapturePolicy


def make_backend(name: str, device: torch.device):
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ParityInputError("--backend cuda: CUDA is not available on this machine")
        return CudaBackend(device)
    if name == "emulated":
        return EmulatedBackend(device)
    raise ParityInputError(f"unknown backend {name!r} (known: cuda, emulated)")


def owner_modes(engine, mode: str, drafter_mode: str | None) -> dict[str, str]:
    """The mode of each owner: the drafter follows the target unless told otherwise."""
    for m in (mode, drafter_mode or mode):
        if m not in MODES:
            raise ParityInputError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    return {o.name: (mode if o.name == "target" else drafter_mode or mode) for o in engine.owners()}


def dispatcher_for(engine, owner, mode: str, capture_sizes) -> Dispatcher:
    cfg = engine.config
    sizes = validate_capture_sizes(capture_sizes) if capture_sizes is not None \
        else default_capture_sizes(cfg.max_num_batched_tokens)
    uniform = {f.phase: f.uniform_query_len for f in owner.forwards()}
    return Dispatcher(mode, sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens, uniform)


def checked_dispatchers(engine, mode: str, capture_sizes, drafter_mode: str | None) -> dict:
    """Each owner's dispatcher under `mode`, after the capacity audit (raises ShortBuffers)."""
    modes = owner_modes(engine, mode, drafter_mode)
    dispatchers = {o.name: dispatcher_for(engine, o, modes[o.name], capture_sizes) for o in engine.owners()}
    check_capacity(mode, [(o, dispatchers[o.name]) for o in engine.owners()])
    return dispatchers


def install_padded_reference(engine, mode: str, capture_sizes=None, drafter_mode: str | None = None,
                             poison: bool = False, probe=None) -> None:
    """Make `engine` the strict reference of `mode`: same padding, eager execution.

    With `poison`, every padded forward first fills its owner's free padding
    (inputs of padded tokens and rows) with values no real output may depend
    on, so the reference also proves the padding inert. A `probe`
    (`engine.padding_probe.PaddingProbe`) runs the padded forwards instead and
    checks the padding contract under two poisons.
    """
    dispatchers = checked_dispatchers(engine, mode, capture_sizes, drafter_mode)
    for owner in engine.owners():
        if probe is not None:
            padded = functools.partial(probe.execute, owner)
        elif poison:
            padded = functools.partial(_poisoned, owner)
        else:
            padded = None
        owner.executor = PaddedEagerExecutor(dispatchers[owner.name], padded)


def _poisoned(owner, dispatch, fn, meta):
    owner.poison_padding(dispatch)
    return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)


def install_graphs(engine, mode: str, backend_name: str, capture_sizes=None, drafter_mode: str | None = None,
                   policy: CapturePolicy = CapturePolicy()) -> dict:
    """Capture every graph `mode` needs on `engine` and install the executors; returns a summary."""
    modes = owner_modes(engine, mode, drafter_mode)
    if all(m == EAGER for m in modes.values()):
        for owner in engine.owners():
            owner.executor = EagerExecutor()
        return {}
    dispatchers = checked_dispatchers(engine, mode, capture_sizes, drafter_mode)
    backend = make_backend(backend_name, engine.device)
    owners = engine.owners()
    state = [t for o in owners for t in o.state_tensors()]
    # One copy of the state (KV caches and buffers) for the whole install, put back after every capture:
    # one copy per graph kept two alive at once while the next was taken (8 GiB at 8B, long context).
    saved = snapshot_tensors(state)
    restore = lambda: restore_tensors(state, saved)  # noqa: E731
    pools = {"target": backend.new_pool("target")}
    pools["drafter"] = pools["target"] if policy.shared_drafter_pool else backend.new_pool("drafter")
    counts = {}
    for owner in owners:
        dispatcher = dispatchers[owner.name]
        copied = {f.phase: tuple(i for i, name in enumerate(f.outputs) if name in policy.copied_outputs)
                  for f in owner.forwards()}
        executor = policy.executor(owner.name, modes[owner.name], backend, pools[owner.name], dispatcher,
                                   [owner.buffers], policy.weak_outputs, copied)
        capture_metadata = _capture_metadata(owner, executor, policy)
        for forward in owner.forwards():
            counts[forward.phase] = executor.capture_phase(forward.phase, forward.fn, capture_metadata,
                                                           forward.max_tokens, restore)
        owner.executor = executor
    target_dispatcher = engine.owner("target").executor.dispatcher
    return {"backend": backend.name, "capture_sizes": list(target_dispatcher.token_sizes),
            "request_sizes": list(target_dispatcher.req_sizes), "drafter_mode": drafter_mode or mode,
            "shared_drafter_pool": policy.shared_drafter_pool, "graphs": counts}


def uninstall(engine) -> None:
    """Drop every graph an engine's executors hold, with their pools and placeholders: eager executors again.

    A captured graph holds its pool (CUDA: until the graph is destroyed and the
    cache emptied) and every tensor it reads; dropping the executors' references
    is what lets the next run start from the memory the weights alone take.
    """
    for owner in engine.owners():
        executor = owner.executor
        if isinstance(executor, GraphExecutor):
            executor.graphs.clear()
            executor.placeholders.clear()
            executor.pool = None
        owner.executor = EagerExecutor()


def _capture_metadata(owner, executor: GraphExecutor, policy: CapturePolicy):
    if owner.name not in policy.detached_capture_metadata:
        return owner.capture_metadata

    def detached(num_tokens: int, num_reqs: int):
        # NOTE: the placeholders are kept alive, as a dummy-metadata builder keeps its
        # buffers: a CUDA graph does not own what it reads, and freed placeholders
        # would turn a wrong-value bug into out-of-bounds reads.
        meta = detached_copy(owner.capture_metadata(num_tokens, num_reqs))
        executor.placeholders.append(meta)
        return meta
    return detached


def detached_copy(meta):
    """The same metadata values in fresh tensors that nothing will ever update."""
    fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
    return type(meta)(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})
