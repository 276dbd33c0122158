"""Adapters: the audit for `torch.cuda.graph` blocks and for make_graphed_callables-style callables.

- `audited_graph(g, fn, name=...)`: a `torch.cuda.graph` block (or the emulated
  one, for an emulated graph) whose explicit callable is audited; the block
  yields the GraphAudit to call, and `g.replay()` is audited from then on.
- `@graphed(*sample_args, name=...)`: like `torch.cuda.make_graphed_callables`
  for inference: static inputs cloned from the samples, warm-up on a side
  stream, one capture; each call copies its tensor arguments into the static
  inputs and replays, audited.
- `KeyedAudit(runnable, key=...)`: the runnable a graph wrapper captures and
  replays once per key (vLLM's CUDAGraphWrapper and its batch descriptor):
  one GraphAudit per key, the runnable itself where the wrapper runs eagerly.
The vLLM `CUDAGraphWrapper` recipe is in docs/audit.md.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from parity.audit import emulated
from parity.audit.audit import GraphAudit
from parity.audit.capture import capturing, paused_gc
from parity.audit.trace import WriteLog


# The wrapper's call is a few frames above the audit's replay (wrapper -> graph.replay -> the audit): looked for
# no further, so a replay pays for a few frames' locals at most.
WRAPPER_DEPTH = 16


def _name_of(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


@contextlib.contextmanager
def audited_graph(graph, fn, *, name: str | None = None, pool=None, stream=None, **options):
    """Capture `graph` around an explicit callable; yields the GraphAudit to call inside the block.

        with audited_graph(g, model.decode, name="decode[bs=8]", pool=pool) as decode:
            out = decode(static_tokens, static_positions)
        g.replay()          # audited

    `fn` may be a GraphAudit already; other keyword arguments go to GraphAudit.
    """
    audit = fn if isinstance(fn, GraphAudit) else GraphAudit(fn, name=name or _name_of(fn), **options)
    if isinstance(graph, emulated.CUDAGraph):
        block = emulated.graph(graph, pool=pool)
    else:
        block = torch.cuda.graph(graph, pool=pool, stream=stream)
    with paused_gc(), capturing(graph), block:
        yield audit
    if audit.graph is None:
        raise RuntimeError(f"{audit.name}: the capture block never called the audited callable")


def _warm_up(fn, args, iterations: int) -> None:
    """Run fn eagerly (CUDA: on a side stream) so lazy initialisation stays out of the capture; undone."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    with torch.no_grad(), WriteLog() as log:
        if cuda:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(iterations):
                    fn(*args)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
        else:
            for _ in range(iterations):
                fn(*args)
    log.undo()


class GraphedCallable:
    """fn captured once on static copies of its sample arguments; calls copy in and replay (audited)."""

    def __init__(self, fn, sample_args: tuple, *, name: str, pool=None, warmup: int = 3, **options):
        self.fn = fn
        self.static_args = tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in sample_args)
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in sample_args)
        _warm_up(fn, self.static_args, warmup if cuda else 0)
        self.graph = torch.cuda.CUDAGraph() if cuda else emulated.CUDAGraph()
        self.audit = GraphAudit(fn, name=name, **options)
        with audited_graph(self.graph, self.audit, pool=pool) as run:
            # NOTE: held so the outputs' memory stays the graph's, as make_graphed_callables holds its own.
            self.static_outputs = run(*self.static_args)

    def __call__(self, *args):
        if len(args) != len(self.static_args):
            raise TypeError(f"{self.audit.name}: expected {len(self.static_args)} arguments, got {len(args)}")
        for static, live in zip(self.static_args, args):
            if isinstance(static, torch.Tensor):
                static.copy_(live)
            elif static != live:
                raise ValueError(f"{self.audit.name}: non-tensor argument {live!r} differs from the captured "
                                 f"{static!r}; a graph cannot change it")
        return self.audit.replay()


def graphed(*sample_args, name: str | None = None, pool=None, warmup: int = 3, **options):
    """Decorator: make fn a graphed callable captured on `sample_args` (make_graphed_callables-style), audited.

        @graphed(torch.zeros(8, 128, device="cuda"), name="mlp", every=16)
        def mlp(x):
            return torch.relu(x @ w1) @ w2
        y = mlp(x)          # copies x into the static input, replays, checks every 16th call
    """
    def wrap(fn):
        return GraphedCallable(fn, sample_args, name=name or _name_of(fn), pool=pool, warmup=warmup, **options)
    return wrap


class KeyedAudit:
    """A runnable a graph wrapper captures once per key: one GraphAudit per key, bound to that key's graph.

        wrapper.runnable = KeyedAudit(wrapper.runnable, key=lambda: get_forward_context().batch_descriptor,
                                      active=lambda: get_forward_context().cudagraph_runtime_mode == mode,
                                      name=lambda key: f"submod_1[num_tokens={key.num_tokens}]")

    `active()` False: the wrapper runs eagerly, so does this. `name`: a string
    (the key is appended) or a function of the key. Other keyword arguments go
    to each GraphAudit. The capture must be one the audit sees open
    (`auto_audit`, the pytest plugin or the emulated backend), to bind each
    audit to its graph.
    """

    def __init__(self, runnable, *, key, name=None, active=None, **options):
        self.runnable, self.key, self.active, self.options = runnable, key, active, options
        self.name = name if name is not None else _name_of(runnable)
        self.audits: dict = {}

    def __call__(self, *args, **kwargs):
        if self.active is not None and not self.active():
            return self.runnable(*args, **kwargs)
        key = self.key()
        audit = self.audits.get(key)
        if audit is None:
            name = self.name(key) if callable(self.name) else f"{self.name}[{key}]"
            audit = self.audits[key] = GraphAudit(self.runnable, name=name, **self.options)
            audit.live_arguments = self.wrapper_arguments
        result = audit(*args, **kwargs)
        if audit.record is not None and audit.graph is None:
            raise RuntimeError(f"{audit.name}: captured in a CUDA graph the audit cannot see; capture inside "
                               "parity.audit.auto_audit() (or pytest --parity-audit) to bind it")
        return result

    def wrapper_arguments(self) -> tuple[tuple, dict] | None:
        """The arguments of the wrapper call that is replaying now: the frame of the object whose `runnable` is
        this one (vLLM's `CUDAGraphWrapper.__call__(self, *args, **kwargs)`); None outside such a call. The
        wrapper replays without handing them to the graph, so only this shows what the caller passed (a fresh
        tensor where the capture's argument was: BUFFER_REASSIGNED)."""
        frame = sys._getframe(1)
        for _ in range(WRAPPER_DEPTH):
            if frame is None:
                break
            caller = frame.f_locals.get("self")
            if caller is not None and getattr(caller, "runnable", None) is self:
                args, kwargs = frame.f_locals.get("args"), frame.f_locals.get("kwargs")
                return (tuple(args), dict(kwargs or {})) if isinstance(args, tuple) else None
            frame = frame.f_back
        return None
