"""Audit every graph captured in a scope, without touching the code that captures them.

    with auto_audit(every=1) as session:
        engine = MyEngine()          # its torch.cuda.graph / emulated captures are audited
        engine.generate(prompts)
    session.assert_clean()

For the scope's duration `torch.cuda.CUDAGraph` is replaced by a subclass
whose capture_begin/capture_end open a capture frame, and the emulated
stand-in reports its captures. Each capture is traced (read set) and the one
call its block made is found (`infer.py`); that callable becomes a GraphAudit
bound to the graph, so the engine's own `g.replay()` calls are checked. A
block with no single callable raises `CaptureNotAudited` saying what to do:
nothing is skipped silently.
Audits and their errors are collected in an `AuditSession` (the pytest
plugin's `graph_audit` fixture is one).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from parity.audit import audit as audit_module
from parity.audit import capture as capture_stack
from parity.audit import emulated, lifetime
from parity.audit.audit import GraphAudit
from parity.audit.diagnosis import GraphParityError
from parity.audit.infer import BlockSpy, block_frame, describe
from parity.audit.options import AuditConfigError, resolve
from parity.audit.trace import ReadSetTracer


@dataclass
class _Block:
    tracer: ReadSetTracer
    spy: BlockSpy


class CaptureNotAudited(RuntimeError):
    """A capture the auto-audit cannot audit (no single callable in its block): one line saying what to do."""


class AuditSession:
    """What audits found in one scope: audits made, errors, NOT_REFRESHED findings.

    every / on_mismatch: defaults for the audits it makes. configure(fn, args)
    -> dict: extra GraphAudit options per auto-audited callable (num_valid,
    static_inputs, output_names, ...); set it before the engine captures.
    """

    def __init__(self, every: int = 1, on_mismatch: str = "record", configure=None):
        resolve({"every": every, "on_mismatch": on_mismatch}, "AuditSession")
        self.every, self.on_mismatch, self._configure = every, on_mismatch, configure
        self.audits: list[GraphAudit] = []
        self.errors: list[GraphParityError] = []
        self.findings: list[dict] = []

    @property
    def configure(self):
        """Options per auto-audited callable: a function (fn, args) -> dict, or None."""
        return self._configure

    @configure.setter
    def configure(self, value) -> None:
        made = [a.name for a in self.audits if hasattr(a, "configured_by")]
        if made:
            raise AuditConfigError(_too_late(made))
        self._configure = value

    def wrap(self, fn, *, name: str, **options) -> GraphAudit:
        """A GraphAudit reporting to this session (every/on_mismatch default to the session's)."""
        options.setdefault("every", self.every)
        options.setdefault("on_mismatch", self.on_mismatch)
        audit = GraphAudit(fn, name=name, **options)
        audit.sink = self
        self.audits.append(audit)
        return audit

    def add_error(self, audit: GraphAudit, error: GraphParityError) -> None:
        self.errors.append(error)

    def add_finding(self, audit: GraphAudit, diagnosis: dict) -> None:
        self.findings.append(diagnosis)

    def replaying(self, audit: GraphAudit) -> None:
        """Before a replay reported here: an auto-audit made without this session's configure is an error."""
        if self._configure is None or not hasattr(audit, "configured_by"):
            return
        if not _same_function(audit.configured_by, self._configure):
            raise AuditConfigError(_too_late([audit.name]))

    def auto(self):
        """A block in which every capture is audited into this session (what --parity-audit does per test)."""
        return auto_audit(session=self)

    def assert_clean(self) -> None:
        """Raise the first error any audit of this session recorded."""
        if self.errors:
            raise self.errors[0]

    # --- capture hooks (called by the patched CUDAGraph and the emulated stand-in) -------

    def capture_began(self, graph, frame) -> None:
        tracer = ReadSetTracer()
        tracer.__enter__()
        spy = BlockSpy(block_frame(sys._getframe(1)), tracer)
        spy.start()
        frame.hooks = _Block(tracer, spy)

    def capture_ending(self, graph, frame) -> None:
        block = frame.hooks
        if block is not None:
            block.spy.stop()
            block.tracer.__exit__(None, None, None)

    def capture_ended(self, graph, frame) -> None:
        block, frame.hooks = frame.hooks, None
        if block is None:
            return
        try:
            if not frame.audits:
                self._audit_block(graph, block)
        finally:
            # NOTE: the spy holds the block's frame (its locals: the strong outputs) and the callable's result;
            # kept, they wait for the cyclic GC and the engine's pool hands out other memory than unaudited.
            block.spy.release()

    def _audit_block(self, graph, block: _Block) -> None:
        call = block.spy.callable()
        if call is None:
            where = f"{block.spy.frame.f_code.co_filename}:{block.spy.frame.f_lineno}" if block.spy.frame else "?"
            why = block.spy.why() if block.spy.chosen() is None else "calls a callable the audit cannot rebuild"
            raise CaptureNotAudited(f"parity.audit: the capture block at {where} {why}; wrap the block's body in "
                                    "one function, or capture with audited_graph(graph, fn)")
        options = dict(self._configure(call.fn, call.args) or {}) if self._configure else {}
        audit = self.wrap(call.fn, name=options.pop("name", describe(call)), **options)
        audit.configured_by = self._configure
        audit.locate = True            # named after where the engine keeps the graph, at its first replay
        # NOTE: a graph outlives the scope that captured it (a module-scoped engine): its audit reports
        # to whichever session is active at the replay, not to this one.
        audit.sink = None
        audit.adopt(call.args, call.kwargs, block.tracer, block.spy.result, block.spy.host_before)
        audit.bind(graph)


def _same_function(a, b) -> bool:
    """The same configure: the same object, or functions of the same code (a lambda written once, made twice)."""
    return a is b or (getattr(a, "__code__", None) is not None and getattr(a, "__code__", None) is getattr(
        b, "__code__", None))


def _too_late(names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"graph_audit.configure was set after {shown} had been captured, so it would not apply to them: set "
            "it before the engine captures its graphs (in the fixture that builds the engine, before building it)")


def _auditing_graph_class(base):
    """torch.cuda.CUDAGraph, with capture_begin/capture_end reporting to the active session."""

    class AuditingCUDAGraph(base):
        def capture_begin(self, *args, **kwargs):
            self._parity_gc = capture_stack.paused_gc()
            self._parity_gc.__enter__()
            super().capture_begin(*args, **kwargs)
            frame = capture_stack.push(self)
            if _SESSIONS and not frame.internal:
                _SESSIONS[-1].capture_began(self, frame)

        def capture_end(self):
            frame = capture_stack.frame_of(self)
            active = bool(_SESSIONS) and frame is not None and not frame.internal
            if active:
                _SESSIONS[-1].capture_ending(self, frame)
            try:
                super().capture_end()
            finally:
                capture_stack.pop(self)
                self._parity_gc.__exit__(None, None, None)
            if active:
                _SESSIONS[-1].capture_ended(self, frame)

    AuditingCUDAGraph.__name__ = AuditingCUDAGraph.__qualname__ = "CUDAGraph"
    return AuditingCUDAGraph


_SESSIONS: list[AuditSession] = []
_ORIGINAL = {}


def _patch(session: AuditSession) -> None:
    if not _SESSIONS:
        graphs = sys.modules.get("torch.cuda.graphs")
        _ORIGINAL["cuda"] = torch.cuda.CUDAGraph
        patched = _auditing_graph_class(torch.cuda.CUDAGraph)
        torch.cuda.CUDAGraph = patched
        if graphs is not None:
            graphs.CUDAGraph = patched
    _SESSIONS.append(session)
    emulated.AUTO_HOOKS = session
    audit_module.DEFAULT_SINK = session


def _unpatch(session: AuditSession) -> None:
    _SESSIONS.remove(session)
    emulated.AUTO_HOOKS = _SESSIONS[-1] if _SESSIONS else None
    audit_module.DEFAULT_SINK = _SESSIONS[-1] if _SESSIONS else None
    if not _SESSIONS:
        lifetime.stop()
        torch.cuda.CUDAGraph = _ORIGINAL["cuda"]
        graphs = sys.modules.get("torch.cuda.graphs")
        if graphs is not None:
            graphs.CUDAGraph = _ORIGINAL["cuda"]


@contextlib.contextmanager
def auto_audit(every: int = 1, on_mismatch: str = "record", configure=None, session: AuditSession | None = None):
    """Audit every graph captured inside the block; yields the AuditSession collecting the results."""
    session = session or AuditSession(every, on_mismatch, configure)
    _patch(session)
    try:
        yield session
    finally:
        _unpatch(session)
