"""GraphAudit: wrap the callable you capture; every replay of its graph is checked against it run eagerly.

    audit = GraphAudit(step, name="decode[bs=4]", num_valid=lambda: engine.num_reqs)
    g = torch.cuda.CUDAGraph()                      # or parity.audit.emulated.CUDAGraph()
    with audited_graph(g, audit, pool=pool):        # or a plain torch.cuda.graph block under the plugin
        out = audit(static_inputs)                  # capture: records read set, roles, host values
    ...
    g.replay()                                      # or out = audit(live_inputs): replay, checked

Each replay re-resolves the roles (cheap checks: a rebound buffer, a static
input never refreshed); every `every`-th replay also runs the shadow check
(`check.py`) and, on a mismatch, the one-variable experiments that name the
cause. A failed check raises `GraphParityError` (on_mismatch="raise") or is
appended to `audit.errors` (on_mismatch="record").
"""

from __future__ import annotations

import warnings
import weakref
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from parity.audit import lifetime, pool, replay_checks
from parity.audit.state import bit_equal
from parity.audit.backends import backend_for
from parity.audit.capture import cuda_capturing, current_frame, paused_gc
from parity.audit.cheap import not_refreshed, rebinds
from parity.audit.check import cheap_reassigned, checked_replay
from parity.audit.context import capture_hints, none_at_capture
from parity.audit.locate import located
from parity.audit.options import resolve
from parity.audit.diagnosis import GraphAuditWarning, GraphParityError, make_diagnosis, summary
from parity.audit.record import CaptureRecord, build_record, padded_rows_of
from parity.graphs.host_state import moved_in, values_of
from parity.graphs.roles import roots_of
from parity.audit.trace import ReadSetTracer

# The sink of every audit that has none of its own (the pytest plugin sets it per test).
DEFAULT_SINK = None
_TENSOR = object()      # where fn's result held an output tensor


class _ReplayHook:
    """Installed as `graph.replay`: the engine's own replay calls go through the audit."""

    def __init__(self, audit: "GraphAudit"):
        self.audit = audit

    def __call__(self) -> None:
        self.audit.replay()


class GraphAudit:
    """Checks every replay of a captured callable against the callable run eagerly, bitwise.

    fn: the callable captured in the graph. name: how reports name the graph.
    static_inputs: {name: tensor | object | zero-argument getter} naming buffers
    the graph reads that fn's arguments and bound object do not reach (a
    forward context, a buffer registry); declared tensors are also watched for
    NOT_REFRESHED. every: shadow-check every N-th replay (the 1st, N+1-th, ...);
    0 keeps only the cheap checks. on_mismatch: "raise" or "record".
    num_valid: real rows of the padded batch (an int or a zero-argument
    callable read at each replay): enables the PADDING_LEAK check. padding:
    {role name: poison value} for inputs to poison beyond the per-step float
    ones (NaN by default). padded_rows: the graph's batch size (default:
    leading dimension of its first output).
    output_names: names for fn's output tensors, in order. not_refreshed_after:
    replays after which a declared input never written since capture is
    reported (0: never).
    """

    def __init__(self, fn: Callable, *, name: str, **options):
        o = resolve(options, f"GraphAudit({name!r})")
        self.fn, self.name, self.static_inputs, self.every = fn, name, o["static_inputs"], o["every"]
        self.on_mismatch, self.num_valid, self.output_names = o["on_mismatch"], o["num_valid"], o["output_names"]
        self.padding = o["padding"]
        self.not_refreshed_after = o["not_refreshed_after"]
        self._padded_rows = o["padded_rows"]
        self._overwritten_inputs = []     # inputs in memory the capture handed out (`pool.inputs_overwritten`)
        self.live_arguments = None      # a zero-argument callable: (args, kwargs) the engine replays for (KeyedAudit)
        self._graph_ref = None
        self.record: CaptureRecord | None = None
        self.backend = None
        self.replays = 0
        self.replayed_at = 0         # when it last replayed, among all audits (lifetime.py's clock)
        self.mismatches = 0          # checked replays that differed from eager
        self.errors: list[GraphParityError] = []
        self.findings: list[dict] = []
        self.sink = None
        self.family = pool.family_of(fn)
        self._reported: set = set()
        self._not_refreshed: set[int] = set()
        self._spec = None
        self._leaves: list = []
        self._padding_checked = False

    # --- capture -----------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        """Inside a capture: run fn and record it. Afterwards: replay the graph (checked). Before: run fn."""
        frame = current_frame()
        if frame is not None and not frame.internal:
            return self.capture_call(args, kwargs, frame)
        if frame is None and cuda_capturing():
            return self.capture_call(args, kwargs, None)
        if self.graph is None:
            return self.fn(*args, **kwargs)
        return self.replay(*args, **kwargs)

    def capture_call(self, args: tuple, kwargs: dict, frame=None):
        """Run fn inside the open capture of `frame` (None: a CUDA capture bind() will name), recording it."""
        before = values_of(roots_of(self.fn, args, kwargs, self.static_inputs))
        tracer = ReadSetTracer()
        with paused_gc(), tracer:
            result = self.fn(*args, **kwargs)
        self.adopt(args, kwargs, tracer, result, before)
        if frame is not None:
            frame.audits.append(self)
            self.bind(frame.graph)
        return result

    def adopt(self, args, kwargs, tracer: ReadSetTracer, result, before: dict | None = None) -> None:
        """Take a capture of fn(*args, **kwargs) that returned `result`, traced by `tracer`; `before`: the host
        values its roots held when the call began."""
        self.record = build_record(self.fn, args, kwargs, self.static_inputs, tracer, result, self.output_names)
        self._overwritten_inputs = pool.inputs_overwritten(self.record)
        # NOTE: the graph baked the host values the callable read, before it advanced any itself.
        roots = roots_of(self.fn, args, kwargs, self.static_inputs)
        for path, (old, _) in moved_in(before or {}, roots).items():
            self.record.host[path] = old
        leaves, self._spec = tree_flatten(result)
        # NOTE: the tensors themselves are not kept: holding them would keep pool memory the engine
        # lets go of (vLLM holds outputs weakly), and the audited engine would allocate differently.
        self._leaves = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
        self._none_at_capture = none_at_capture(self.static_inputs)
        pool.link(self)
        lifetime.register(self)

    def bind(self, graph) -> "GraphAudit":
        """Audit `graph`'s replays: its `replay()` now goes through this audit."""
        if self.record is None:
            raise RuntimeError(f"{self.name}: bind() needs a capture made through this audit first")
        if isinstance(getattr(graph, "replay", None), _ReplayHook):
            if graph.replay.audit is self:
                return self
            raise ValueError(f"graph is already audited by {graph.replay.audit.name!r}")
        # NOTE: the graph is held weakly (it holds the audit through its replay hook), so a graph
        # and its audit die with their owner by reference counting, never in a later GC pass that
        # could run inside another capture.
        self._graph_ref, self.backend = weakref.ref(graph), backend_for(graph)
        own = graph.__dict__.get("replay")
        replay, ref = type(graph).replay, self._graph_ref
        self._raw_replay = own if own is not None else (lambda: replay(ref()))
        graph.replay = _ReplayHook(self)
        return self

    @property
    def graph(self):
        """The graph this audit is bound to (None before bind())."""
        return self._graph_ref() if self._graph_ref is not None else None

    # --- replay ------------------------------------------------------------------------

    def replay(self, *args, **kwargs):
        """Replay the graph (live inputs: `args`/`kwargs`, else the captured ones), check it, return its outputs."""
        if self.graph is None:
            raise RuntimeError(f"{self.name}: replay() before a capture bound to a graph")
        record = self.record
        if not args and not kwargs:
            args, kwargs = replay_checks.arguments(self)
        self.replays += 1
        record.settle()
        if self.replays == 1 and getattr(self, "locate", False):
            self.name = located(self.graph) or self.name
        sink = self.sink or DEFAULT_SINK
        if sink is not None:
            sink.replaying(self)
        pool.before_replay(self)
        roots = roots_of(record.fn, args, kwargs, self.static_inputs)
        found = rebinds(record, roots)
        self._check_versions()
        too_small = replay_checks.smaller_than_the_batch(self)
        wrong = replay_checks.wrong_graph(self)
        due = (self._due() or too_small is not None) and not self._overwritten_inputs and wrong is None
        lifetime.before_replay(self, due)
        read = [role.tensor.clone() for role in self._overwritten_inputs]
        try:
            if due:
                diagnoses = checked_replay(self, roots, args, kwargs, found)
            else:
                self._raw_replay()
                pool.after_replay(self)
                diagnoses = [d for d in (cheap_reassigned(self, found),) if d is not None]
        finally:
            lifetime.after_replay(self)
        # NOTE: confirmed by the replay itself: it changed inputs it reads (no other experiment is sound here).
        overwritten = [role.name for role, value in zip(self._overwritten_inputs, read)
                       if not bit_equal(role.tensor, value)]
        if overwritten:
            diagnoses = [replay_checks.inputs_overwritten(self, overwritten)]
        if wrong is not None:
            diagnoses = [wrong]
        # NOTE: a graph that equals its callable at its own shape and still cannot hold the batch was looked up for
        # another size; one that differs from it is told by its own experiments (an output sliced by a frozen count).
        for diagnosis in diagnoses or ([too_small] if too_small else []):
            self._report(diagnosis)
        return self.outputs

    def _due(self) -> bool:
        """A shadow check now: every `every`-th replay, and the first replay with padded rows (padding check)."""
        if not self.every:
            return False
        num_valid, padded = self.num_valid_now(), self.padded_rows
        padded_now = num_valid is not None and padded is not None and num_valid < padded
        due = (self.replays - 1) % self.every == 0 or (padded_now and not self._padding_checked)
        self._padding_checked |= due and padded_now
        return due

    @property
    def outputs(self):
        """The graph's outputs, structured as fn returned them (aliases that own no memory)."""
        if self._spec is None:
            return None
        it = iter(self.record.outputs)
        leaves = [next(it) if x is _TENSOR else x for x in self._leaves]
        return tree_unflatten(leaves, self._spec)

    # --- reporting ---------------------------------------------------------------------

    @property
    def padded_rows(self) -> int | None:
        return self._padded_rows if self._padded_rows is not None else padded_rows_of(self.record)

    def num_valid_now(self) -> int | None:
        value = self.num_valid() if callable(self.num_valid) else self.num_valid
        return None if value is None else int(value)

    def graph_info(self) -> dict:
        return {"name": self.name, "backend": self.backend.name if self.backend else None, "runtime_mode": "full",
                "num_tokens": self.padded_rows, "num_reqs": self.num_valid_now(),
                "captured_ops": self.record.num_ops, "roles": len(self.record.roles)}

    def _diagnosis(self, kind: str, buffers, **details) -> dict:
        if kind != "NOT_REFRESHED":
            details["evidence"] = [*details.get("evidence", ()),
                                   *capture_hints(getattr(self, "_none_at_capture", []), self.static_inputs)]
        return make_diagnosis(kind, buffers, owner=self.name, replay=self.replays, graph=self.graph_info(),
                              **details)

    def _report(self, diagnosis: dict) -> None:
        error = GraphParityError(diagnosis)
        key = (diagnosis["kind"], tuple(diagnosis["buffers"]))
        if key not in self._reported:
            self._reported.add(key)
            self.errors.append(error)
            sink = self.sink or DEFAULT_SINK
            if sink is not None:
                sink.add_error(self, error)
        if self.on_mismatch == "raise":
            raise error

    def _check_versions(self) -> None:
        if not self.not_refreshed_after:
            return
        for role in not_refreshed(self.record, self.replays, self.not_refreshed_after, self._not_refreshed):
            diagnosis = self._diagnosis("NOT_REFRESHED", [role.name], captured_address=role.address, evidence=[
                f"{role.name} ({tuple(role.shape)} at 0x{role.address:x}) is a static input the graph reads and has "
                f"not been written since capture, {self.replays} replays ago: if it should change per step, "
                "it is stale"], experiment="version counter check (no shadow run)")
            self.findings.append(diagnosis)
            sink = self.sink or DEFAULT_SINK
            if sink is not None:
                sink.add_finding(self, diagnosis)
            warnings.warn(GraphAuditWarning(summary(diagnosis)), stacklevel=4)

    def __repr__(self) -> str:
        state = "bound" if self.graph is not None else ("recorded" if self.record else "not captured")
        return f"GraphAudit({self.name!r}, {state}, replays={self.replays}, errors={len(self.errors)})"
