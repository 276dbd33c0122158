"""The workbench every one-variable experiment runs on: one forward known to differ from its reference.

Two diagnosers hand a divergent forward over as a `Lab`:
- the audit's `ShadowLab`: one checked replay of a user's graphed callable;
  its reference is the callable run eagerly on the same live inputs (the
  shadow run);
- the harness's `parity.diagnose.lab.Divergence`: the first divergent forward
  of a lockstep; its reference is the padded eager reference engine.
A stage sees only the interface below, so it runs on either; it must not assume
which reference the lab compares with, nor how the lab names a tensor.

- `run(change, graph, redirect)`: put the forward back at its pre-state, apply
  `change()` (the one thing an experiment changes), run the forward under test
  (its graph replayed; `graph`: a re-capture's instead) and return what it
  produced (a value `matches` takes); what it wrote to the captured tensor of
  each (captured, live) pair of `redirect` is taken as written to the live one;
- `matches(result)`: is `result` the reference's, bit for bit?
- `recapture(overrides)`: a fresh graph of the forward, captured on the
  pre-state with the host values named in `overrides` (by the lab's own names)
  set; the lab stands at its pre-state after;
- `name(tensor)`: the owner path that names the tensor's storage (None: no
  owner the lab knows reaches it);
- `repairs()`: the captured reads against the live reads, as `repairs.Unit`s
  (what `repairs.stage` tries);
- `host_values()`: the host values that differ from capture, and inputs absent
  then, as `recaptures.HostValue`s keyed as `recapture` takes them;
  `skipped_writes()`: the names of what the reference writes and the graph
  never does;
- `drifts()`: the roles held now as another view (offset, sizes, strides) of
  the storage the graph captured, as `handed.Drift`s; `rebound()`: the roles
  held at a fresh tensor where the graph reads a persistent buffer another
  holder still reaches; `handed(drifts)`: does the reference, run with those
  roles handed as the graph reads them, produce what the graph produced, bit
  for bit (None: it cannot be run so)?
- `diagnosis(kind, buffers, **found)`: the lab's record of a stage's verdict;
- `replays`: every forward run so far to test a hypothesis; `ruled_out`: the
  experiments that did not restore parity, in order.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch.utils._pytree import tree_flatten

from parity.audit.experiments import copy_repairs
from parity.audit.recaptures import HostValue
from parity.audit.repairs import units
from parity.audit.state import Result, Snapshot, clone_outputs, compare
from parity.audit.handed import Drift, at_captured_layout, drifted
from parity.audit.trace import WriteLog, storage_ptr
from parity.audit.writes import skipped_writes
from parity.diagnosis.record import Diagnosis
from parity.graphs.host_state import restore_in
from parity.graphs.roles import MISSING, Path, assign, resolve, walk

MAX_HOST_VALUES = 16


@runtime_checkable
class Lab(Protocol):
    replays: int
    ruled_out: list

    def run(self, change=None, graph=None, redirect=()): ...

    def matches(self, result) -> bool: ...

    def recapture(self, overrides: dict): ...

    def name(self, tensor: torch.Tensor) -> str | None: ...

    def repairs(self) -> list: ...

    def host_values(self) -> list: ...

    def skipped_writes(self) -> list[str]: ...

    def drifts(self) -> list: ...

    def rebound(self) -> list: ...

    def handed(self, drifts: list) -> bool | None: ...

    def diagnosis(self, kind: str, buffers, **found): ...


@dataclass
class Recaptured:
    """A re-captured graph of the audited callable and the outputs its replays write."""
    graph: object
    outputs: list[torch.Tensor]


class ShadowLab:
    """A checked replay's workbench: the pre-replay state, the eager shadow run as reference, the graph."""

    def __init__(self, audit, roots: dict, args: tuple, kwargs: dict, pre: Snapshot, eager: Result,
                 moved: dict | None = None, rebinds: list | None = None, replayed: Result | None = None):
        self.audit = audit
        self.moved = moved or {}    # host values the callable advanced itself when run eagerly: path -> (a, b)
        self.record = audit.record
        self.roots = roots
        self.args, self.kwargs = args, kwargs
        self.pre = pre
        self.eager = eager
        self.replayed = replayed        # what the real replay produced: outputs, and its bytes where eager writes
        self.rebinds = rebinds or []    # roles whose path reaches another tensor than at capture (`cheap.Rebind`)
        self.replays = 0
        self.ruled_out: list[str] = []
        self.notes: list[str] = []      # the moved roles no copy can repair (told in the evidence)
        self.layouts = self.record.layouts

    def run(self, change=None, graph: Recaptured | None = None, redirect=()) -> Result:
        """Replay from the pre-replay state after `change()`; the result over the storages the eager run wrote
        (where the graph wrote a captured storage of `redirect` whose live one eager writes: the captured bytes)."""
        self.pre.restore()
        if change is not None:
            change()
        if graph is None:
            self.audit._raw_replay()
        else:
            graph.graph.replay()
        self.replays += 1
        writes = {ptr: self.pre.saved[ptr][0].clone() for ptr in self.eager.writes}
        for captured, live in redirect:
            dst = storage_ptr(live)
            # NOTE: what the graph wrote through the captured tensor stands where eager writes the live one (a KV
            # cache reallocated after capture, whole or as a view of a larger storage).
            if storage_ptr(captured) != dst and dst in writes:
                placed(writes[dst], live).copy_(captured)
        return Result(clone_outputs(self.record.outputs if graph is None else graph.outputs), writes)

    def matches(self, result: Result) -> bool:
        return compare(result, self.eager, self.record.output_names, layouts=self.layouts,
                       defined=self.record.defined) is None

    def recapture(self, overrides: dict) -> Recaptured:
        """Re-capture the callable with `overrides` ({Path: value}) applied to the live objects, then undo them."""
        self.pre.restore()       # NOTE: first: it puts the host values back too, the overrides' included
        with self._assigned(overrides) as (roots, args, kwargs):
            def start():
                """Before each call (a warm-up moves what the callable advances): the pre-replay host values, then
                the overrides."""
                restore_in(self.pre.host, self.roots)
                for path, value in overrides.items():
                    assign(path, roots, value)
            graph, outputs = self.audit.backend.recapture(self.record.fn, tuple(args), kwargs, start)
        return Recaptured(graph, [t for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor)])

    @contextmanager
    def _assigned(self, paths):
        """(roots, args, kwargs): the callable's roots with copies of its arguments; whatever the block assigns
        at `paths` is put back after."""
        args, kwargs = list(self.args), dict(self.kwargs)
        roots = {**self.roots, "args": args, "kwargs": kwargs}
        undo = [(path, resolve(path, roots)) for path in paths]
        try:
            yield roots, args, kwargs
        finally:
            for path, old in reversed(undo):
                if old is not MISSING:
                    assign(path, roots, old)

    def name(self, tensor: torch.Tensor) -> str | None:
        """The shortest path from the callable's roots that reaches the tensor's storage."""
        ptr = storage_ptr(tensor)
        for path, value in walk(self.roots):
            if isinstance(value, torch.Tensor) and value.numel() and storage_ptr(value) == ptr:
                return str(path)
        return None

    def repairs(self) -> list:
        """One copy per moved role, each its own variable (`experiments.copy_repairs`, `repairs.units`), judged on
        the pre-replay state (a copy of equal values there is futile)."""
        self.pre.restore()
        found, self.notes = copy_repairs(self.rebinds)
        return units(found)

    def diagnosis(self, kind: str, buffers, **found) -> Diagnosis:
        """The audit's record of a verdict at this replay (`found`: evidence, experiment, captured, live...)."""
        found["captured_address"] = found.pop("captured", None)
        found["live_address"] = found.pop("live", None)
        found.setdefault("ruled_out", self.ruled_out)
        found["evidence"] = [*found.get("evidence", ()), *self.notes]
        return Diagnosis(**self.audit._diagnosis(kind, list(buffers), replays=self.replays, **found))

    def host_values(self) -> list[HostValue]:
        """Host values that changed since capture, and inputs absent at capture (None) that hold a tensor now,
        shortest paths first (one attribute reached by two paths is one host value)."""
        found, places = [], set()
        for path, captured in sorted(self.record.host.items(), key=lambda item: (item[0].depth(), str(item[0]))):
            live = resolve(path, self.roots)
            absent = captured is None and isinstance(live, torch.Tensor)
            if not absent and (live is MISSING or type(live) is not type(captured) or live == captured):
                continue
            place = (id(resolve(Path(path.root, path.steps[:-1]), self.roots)), path.steps[-1] if path.steps else None)
            if place not in places:
                places.add(place)
                moved = next((ab for p, ab in self.moved.items() if str(p) == str(path)), None)
                found.append(HostValue(path, str(path), captured, live, moved))
        return found[:MAX_HOST_VALUES]

    def skipped_writes(self) -> list[str]:
        """What the eager run writes and the captured graph never does (`writes.skipped_writes`)."""
        return skipped_writes(self)

    def drifts(self) -> list[Drift]:
        """Every role whose path reaches the captured storage, at the captured address and shape, at other
        strides (other offsets and shapes are rebinds, which the copy repairs and the graph-shaped stand-ins
        take)."""
        found = []
        for role in self.record.roles:
            live = resolve(role.path, self.roots)
            if drifted(role.tensor, live) and tuple(live.shape) == role.shape and live.data_ptr() == role.address:
                found.append(Drift(role.name, "path", role.tensor, live, path=role.path))
        return found

    def rebound(self) -> list[Drift]:
        """Roles a path reaches now at another tensor of the captured shape while another role still reaches the
        captured storage (the persistent buffer: `cheap.Rebind.keeper`), to be pointed back at it."""
        return [Drift(r.role.name, "path", r.role.tensor, r.live, path=r.role.path, rebound=True)
                for r in self.rebinds if r.owned and r.real is None and r.live_tensor is not None
                and r.live.shape == r.role.tensor.shape and r.live.dtype == r.role.tensor.dtype]

    def handed(self, drifts: list[Drift]) -> bool | None:
        """Run the callable eagerly from the pre-replay state with each path of `drifts` handed as the graph reads
        it (at the captured layout; a rebound one, the captured tensor): does it produce what the replay produced,
        bit for bit? None when a layout does not fit."""
        views = [d.captured if d.rebound else at_captured_layout(d, d.live) for d in drifts]
        if not drifts or any(v is None for v in views) or self.replayed is None:
            return None
        self.pre.restore()
        try:
            with self._assigned([d.path for d in drifts]) as (roots, args, kwargs):
                if not all(assign(d.path, roots, view) for d, view in zip(drifts, views)):
                    return None
                eager, _ = shadow(self.record.fn, tuple(args), kwargs)
        finally:
            self.pre.restore()
        self.replays += 1
        return compare(self.replayed, eager, self.record.output_names, layouts=self.layouts,
                       defined=self.record.defined) is None


def shadow(fn, args: tuple, kwargs: dict) -> tuple[Result, WriteLog]:
    """`fn` run eagerly; its outputs and writes, already undone (also when fn raises)."""
    log = WriteLog()
    try:
        with torch.no_grad(), log:
            out = fn(*args, **kwargs)
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return Result(clone_outputs(tensors), {ptr: live.clone() for ptr, live in log.written().items()}), log
    finally:
        log.undo()


def placed(storage_bytes: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The elements of `like` (dtype, offset, sizes, strides) inside a copy of its storage's bytes."""
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(
        storage_bytes.untyped_storage(), like.storage_offset(), like.shape, like.stride())
