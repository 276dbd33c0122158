"""Graph executors: dispatch, capture at start-up, replay; one per owner (target, drafter).

Each owner captures into its own pool (the drafter's is dedicated by default,
seed 004). Capture runs on dummy metadata with PAD slots and leaves no trace:
buffers and KV caches are snapshotted before and restored after.

Every graph records what it was captured for (owner, phase, runtime mode,
padded descriptor), and every replay checks it against what the dispatch asked
for, whatever lookup found the graph: a mismatch raises `WrongGraph` before the
graph runs (another forward's graph may read past the batch's buffers). A
capture that stops at an op no graph can capture raises `CaptureError`, naming
the graph and the engine's line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from parity.graphs.capture import CapturedGraph, capture
from parity.graphs.capture_errors import CaptureError, engine_source
from parity.graphs.descriptor import BatchDescriptor, CapturedFor, Dispatch, WrongGraph
from parity.graphs.dispatcher import Dispatcher
from parity.graphs.host_state import host_values, moved
from parity.graphs.manifest import build_manifest, object_tensors
from parity.graphs.modes import EAGER, PIECEWISE


@dataclass
class GraphEntry:
    graph: CapturedGraph
    manifest: tuple
    num_tokens: int
    num_reqs: int
    captured_with: dict     # the Python values of the capture-time metadata
    captured_for: CapturedFor | None = None    # owner, phase, runtime mode and descriptor it was captured for
    capture_meta: object = None    # the capture-time metadata object itself (its tensors are what the graph read)
    # (owner, name) -> the contents of every integer buffer as the capture saw them, kept on the host (no
    # device memory beyond the plan's): a value the forward read to the host while capturing is baked in,
    # and only these contents can show which.
    captured_contents: dict = dataclasses.field(default_factory=dict)
    # The owner object's host values as the capture's forward found them (attribute path -> value), and those
    # the capture's forward moved itself (path -> (before, after)): a replay runs no Python, so it reads the
    # former forever and never moves the latter.
    captured_host: dict = dataclasses.field(default_factory=dict)
    capture_moved: dict = dataclasses.field(default_factory=dict)


class GraphExecutor:
    """Runs the forwards of one owner under one mode on one backend."""

    def __init__(self, owner: str, mode: str, backend, pool, dispatcher: Dispatcher, registries,
                 weak_outputs: bool = True, copied_outputs: dict[str, tuple[int, ...]] | None = None):
        self.owner = owner
        self.mode = mode
        self.backend = backend
        self.pool = pool
        self.dispatcher = dispatcher
        self.registries = registries
        self.weak_outputs = weak_outputs
        self.graphs: dict[tuple, GraphEntry] = {}
        # Tensors captured graphs read that no registry owns: kept alive as long as the graphs.
        self.placeholders: list = []
        self.replays = 0        # graph replays this executor really ran (a mode with none proves nothing)
        self.copied_outputs = copied_outputs or {}   # phase -> indexes of the outputs handed out as copies

    def dispatch(self, phase: str, num_tokens: int, num_reqs: int, uniform: bool) -> Dispatch:
        return self.dispatcher.dispatch(phase, num_tokens, num_reqs, uniform)

    def graph_key(self, phase: str, runtime_mode: str, descriptor: BatchDescriptor) -> tuple:
        """What a graph is stored and looked up under."""
        return (phase, runtime_mode, descriptor)

    def entry(self, dispatch: Dispatch) -> GraphEntry:
        """The captured graph a (non-eager) dispatch replays."""
        return self.graphs[self.graph_key(dispatch.phase, dispatch.runtime_mode, dispatch.descriptor)]

    def wanted(self, dispatch: Dispatch) -> CapturedFor:
        """What the graph a dispatch replays must have been captured for."""
        return CapturedFor(self.owner, dispatch.phase, dispatch.runtime_mode, dispatch.descriptor)

    def execute(self, dispatch: Dispatch, fn, meta):
        if dispatch.runtime_mode == EAGER:
            return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)
        entry = self.entry(dispatch)
        if entry.captured_for != self.wanted(dispatch):
            raise WrongGraph(entry.captured_for, self.wanted(dispatch))
        out = self.replay(entry, meta)
        copied = self.copied_outputs.get(dispatch.phase)
        return tuple(t.clone() if i in copied else t for i, t in enumerate(out)) if copied else out

    def replay(self, entry: GraphEntry, meta):
        """Replay one captured graph on the live metadata, and count it."""
        self.replays += 1
        return entry.graph.replay(meta)

    def capture_phase(self, phase: str, fn, capture_metadata, max_tokens: int, restore) -> int:
        """Capture every graph `phase` can dispatch to; returns how many. `restore()` puts the buffers and KV
        caches back as they were before any capture (a capture leaves no trace)."""
        count, holder = 0, getattr(fn, "__self__", None)
        for runtime, descriptor, num_tokens, num_reqs in self.dispatcher.capture_plan(phase, max_tokens):
            key = self.graph_key(phase, runtime, descriptor)
            if key in self.graphs:
                continue
            captured_for = CapturedFor(self.owner, phase, runtime, descriptor)
            try:
                meta = capture_metadata(num_tokens, num_reqs)
                body = lambda t=num_tokens, r=num_reqs, m=meta: fn(t, r, m)  # noqa: E731
                # Inference, as in a serving engine: no autograd graph keeps
                # temporaries alive, so the pool sees the frees a real capture sees.
                with torch.no_grad():
                    self.backend.warmup(body)
                    contents = {(r.owner, name): t.to("cpu", copy=True) for r in self.registries
                                for name, t in r.items() if not t.is_floating_point()}
                    host = host_values(holder)
                    held = object_tensors(holder)     # the views the capture reads, whatever moves after it
                    graph = self._capture(captured_for, num_reqs, body)
            finally:
                restore()
            manifest = build_manifest(graph.read_storages, self.registries, meta, held)
            self.graphs[key] = GraphEntry(graph, manifest, num_tokens, num_reqs, python_fields(meta), captured_for,
                                          meta, contents, host, moved(host, holder))
            count += 1
        return count


    def _capture(self, captured_for: CapturedFor, num_reqs: int, body) -> CapturedGraph:
        """One capture; an op the backend refuses while capturing becomes a CaptureError at the engine's line."""
        try:
            return capture(self.backend, self.pool, body, piecewise=captured_for.runtime_mode == PIECEWISE,
                           weak_outputs=self.weak_outputs)
        except Exception as exc:
            if not self.backend.refused_while_capturing(exc):
                raise
            raise CaptureError(captured_for, num_reqs, engine_source(exc.__traceback__), _first_line(exc)) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


def python_fields(meta) -> dict:
    """The non-tensor values a metadata object carries (what a graph would bake in)."""
    return {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)
            if not isinstance(getattr(meta, f.name), torch.Tensor) and f.name != "kv_cache"}


class PaddedEagerExecutor:
    """The strict reference: pads exactly as a graph mode does, but runs eagerly.

    `padded(dispatch, fn, meta)`, when given, runs every forward the mode would
    replay a graph for instead of calling `fn` directly: the padded reference
    poisons its padding there, and probes the padding contract.
    """

    def __init__(self, dispatcher: Dispatcher, padded=None):
        self.dispatcher = dispatcher
        self.mode = dispatcher.mode
        self.padded = padded

    def dispatch(self, phase: str, num_tokens: int, num_reqs: int, uniform: bool) -> Dispatch:
        return self.dispatcher.dispatch(phase, num_tokens, num_reqs, uniform)

    def execute(self, dispatch: Dispatch, fn, meta):
        if self.padded is not None and dispatch.runtime_mode != EAGER:
            return self.padded(dispatch, fn, meta)
        return fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded, meta)


def snapshot_tensors(tensors: list[torch.Tensor]):
    return [t.clone() for t in tensors]


def restore_tensors(tensors: list[torch.Tensor], saved) -> None:
    for live, old in zip(tensors, saved):
        live.copy_(old)
