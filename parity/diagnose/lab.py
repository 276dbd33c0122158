"""The divergent forward, as every stage of the diagnosis sees it: one object, handed from stage to stage.

The lockstep (`bisector.py`) stops at the first forward whose outputs differ
by a single bit and hands that forward over as a `Divergence`: both runs
standing just after it (the reference, `ref`, and the run under test,
`graph`: a graph mode's engine, or for the padding stage the reference on
poisoned padding), each run's pre-state (`snaps`: restoring it puts a run back
just before the forward, host values included), what each produced, the graph
the forward replayed (`entry`, None for an eager forward) and where the
outputs differ.

A stage is a function `stage(lab) -> Diagnosis | None`: it runs its
experiments on the lab (each starts from a pre-state, changes one thing,
re-runs and compares bit for bit with the reference's outputs), returns a
diagnosis when one isolated the cause, and otherwise adds what it tried to
`lab.ruled_out` and returns None, so the next stage goes on. The lab counts
every forward re-run (`replays`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


from parity.diagnosis.record import Diagnosis
from parity.audit.recaptures import HostValue
from parity.diagnose.host_moves import moved
from parity.diagnose.readset import graph_writes, reference_writes, storage_roles
from parity.diagnose import handed
from parity.diagnose.repairs import repairs
from parity.diagnose.state import max_diff, outputs, restore
from parity.graphs import host_state
from parity.graphs.capture import capture
from parity.graphs.manager import python_fields
from parity.graphs.modes import PIECEWISE
from parity.graphs.roles import Path
from parity.graphs.tp_agree import agree_all, agree_same


@dataclass
class Divergence:
    mode: str
    ref: object                 # the reference run's engine
    graph: object               # the run under test
    ev_r: object                # the forward's event in each run
    ev_g: object
    snaps: dict                 # {"ref": pre-state, "graph": pre-state}
    out_r: dict                 # what each run's forward produced (`state.outputs`)
    out_g: dict
    where: dict = field(default_factory=dict)     # rows, max_abs_diff, graph_info of the difference
    moves: dict = field(default_factory=dict)     # host values the reference's forward moved: path -> (a, b)
    entry: object = None        # the graph the forward replayed; None: the run under test ran it eagerly
    replays: int = 0            # forwards re-run to test a hypothesis
    ruled_out: list = field(default_factory=list)    # experiments that did not restore parity, in order
    reads: dict | None = None   # role -> holders the reference forward reads (`readset.py`), once asked for
    ref_writes: set = field(default_factory=set)     # roles the reference forward writes (traced with `reads`)

    @property
    def dispatch(self):
        return self.ev_g.dispatch

    @property
    def executor(self):
        return self.graph.owner(self.ev_g.owner).executor

    def side(self, run: str = "graph") -> tuple:
        """(engine, event) of run "graph" or "ref" at the forward."""
        return (self.graph, self.ev_g) if run == "graph" else (self.ref, self.ev_r)

    def restore(self, run: str = "graph") -> None:
        """Put run "graph" or "ref" back just before the forward."""
        restore(self.snaps[run])

    def forward(self, run: str = "graph"):
        """The forward function of the divergent forward, in run "graph" or "ref"."""
        engine, event = self.side(run)
        return engine.owner(event.owner).forward(event.phase).fn

    def run(self, change=None, graph=None, redirect=(), side: str = "graph") -> dict:
        """From the pre-state of run `side` ("graph", or "ref"), `change()`, then the forward through its executor
        (`graph`: that graph replayed on the live metadata instead); what it wrote to each captured tensor of
        `redirect` ((captured, live) pairs) is copied to the live one; its outputs (`parity.audit.lab.Lab`)."""
        engine, event = self.side(side)
        self.restore(side)
        if change is not None:
            change()
        self.replays += 1
        returned = (graph.replay(event.meta) if graph is not None
                    else engine.owner(event.owner).executor.execute(event.dispatch, self.forward(side), event.meta))
        for captured, live in redirect:
            live.copy_(captured)
        return outputs(engine, event, returned)

    def host_values(self) -> list[HostValue]:
        """The owner's host values the reference's forward advanced itself that the graph was captured with at
        another value (by `Path`, the reference's value as the live one: `host_moves.moved`), the metadata's
        inputs absent (None) at capture that hold a tensor now, then its host fields that differ from the
        capture's (the same on every rank), keyed by field as `recapture` takes them; none for a forward the run
        under test ran eagerly."""
        if self.entry is None:
            return []
        graph_pre = self.snaps["graph"]["host"][self.ev_g.owner][1]
        found = []
        for path, (before, after) in moved(self):
            baked = self.entry.captured_host.get(path, graph_pre[path])
            if not agree_same("host moves: captured with the reference's value", host_state.same(baked, before)):
                found.append(HostValue(path, host_state.name(path), baked, before, (before, after)))
        live, captured = self.ev_g.meta, self.entry.captured_with
        absent = agree_same("absent inputs", sorted(k for k, v in captured.items()
                                                    if v is None and isinstance(getattr(live, k, None), torch.Tensor)))
        fields = python_fields(live)
        differing = agree_same("recapture: host fields", sorted(k for k in fields if captured.get(k) != fields[k]))
        return (found + [HostValue(k, k, None, getattr(live, k)) for k in absent]
                + [HostValue(k, k, captured.get(k), fields[k]) for k in differing])

    def skipped_writes(self) -> list[str]:
        """The roles the reference forward writes and the replayed graph never does (`readset.py`)."""
        return [] if self.entry is None else sorted(reference_writes(self) - graph_writes(self))

    def drifts(self) -> list:
        """The roles held as another view of the storage the graph captured (`diagnose/handed.py`)."""
        return [] if self.entry is None else handed.drifts(self)

    def rebound(self) -> list:
        """The roles held at a fresh tensor where the graph read the persistent buffer (`diagnose/handed.py`)."""
        return [] if self.entry is None else handed.rebound(self)

    def handed(self, drifts: list) -> bool | None:
        """Does the reference, with `drifts` handed as the graph reads them, produce the graph's outputs?"""
        return handed.handed(self, drifts)

    def repairs(self) -> list:
        """What the graph read against what the live holders and the reference say it should read, as the
        audit's `repairs.stage` takes them (`diagnose/repairs.py`)."""
        return repairs(self)

    def recapture(self, overrides: dict | None = None, prepare=lambda: None, phase: str | None = None,
                  piecewise: bool | None = None, meta=None):
        """A fresh graph of the forward (of `phase`: another phase's) at the dispatched padded shape, captured from
        `meta` (the capture-time metadata object when None) with `overrides` set (metadata fields by name, the
        owner's host values by `Path`), into a new pool on the graph run's pre-state after `prepare()` (it sets
        the one thing an experiment changes); the run is put back to its pre-state after, whether the capture
        succeeds or raises."""
        d, backend = self.dispatch, self.executor.backend
        fn = self.graph.owner(self.ev_g.owner).forward(phase or self.ev_g.phase).fn
        meta = self.entry.capture_meta if meta is None else meta
        host = {k: v for k, v in (overrides or {}).items() if isinstance(k, Path)}
        if overrides is not None:
            meta = dataclasses.replace(meta, **{k: v for k, v in overrides.items() if k not in host})
        holder = self.snaps["graph"]["host"][self.ev_g.owner][0]
        self.restore()
        try:
            prepare()
            for path, value in host.items():
                if not host_state.put(holder, path, value):
                    raise ValueError(f"{host_state.name(path)} cannot be set")
            return capture(backend, backend.new_pool("bisect"),
                           lambda: fn(d.num_tokens_padded, d.num_reqs_padded, meta),
                           piecewise=d.runtime_mode == PIECEWISE if piecewise is None else piecewise,
                           weak_outputs=False)
        finally:
            self.restore()

    def matches(self, result=None) -> bool:
        """Are the graph run's forward outputs the reference's: `result` as `run` returned it, or (a tuple) what a
        re-run or another graph returned instead of the forward's own outputs, over the run's state now? Under TP:
        on every rank (the ranks' next experiment depends on it)."""
        produced = result if isinstance(result, dict) else outputs(self.graph, self.ev_g, result)
        worst, _ = max_diff(self.out_r, produced)
        return agree_all("experiment: parity restored", worst == 0)

    def name(self, tensor) -> str | None:
        """The role naming the tensor's storage in the graph run (`storage_roles`): a registry buffer's name, a
        metadata field, kv_cache, an attribute path of the owner."""
        roles = storage_roles(self.graph, self.ev_g).get(tensor.untyped_storage().data_ptr())
        return roles[0][0] if roles else None

    def diagnosis(self, kind: str, buffers, **found) -> Diagnosis:
        """A diagnosis at this forward; `found` holds what the stage isolated (evidence, experiment, addresses,
        ruled_out: the lab's when not given)."""
        where = {**self.where, **{k: found.pop(k) for k in ("rows", "max_abs_diff", "graph") if k in found}}
        return diagnosis_at(self.mode, self.ev_g, kind, buffers, self.replays, rows=list(where.get("rows", ())),
                            graph=where.get("graph"), max_abs_diff=where.get("max_abs_diff"),
                            captured_address=found.pop("captured", None), live_address=found.pop("live", None),
                            evidence=list(found.pop("evidence", ())), experiment=found.pop("experiment", None),
                            ruled_out=list(found.pop("ruled_out", self.ruled_out)), also=list(found.pop("also", ())))


def diagnosis_at(mode: str, event, kind: str, buffers, replays: int = 0, **fields) -> Diagnosis:
    """A diagnosis at `event`'s forward, for the stages and the run-level checks alike (`fields`: the other
    `Diagnosis` fields a check isolated: evidence, experiment, ruled_out, max_abs_diff...)."""
    return Diagnosis(kind, list(buffers), mode, owner=event.owner, step=event.step, phase=event.phase,
                     draft_step=event.draft_step, forward_index=event.index, replays=replays, **fields)


def run_stages(lab: Divergence, stages) -> Diagnosis | None:
    """The first diagnosis a stage returns, in order; None when none isolated the cause."""
    for stage in stages:
        found = stage(lab)
        if found is not None:
            return found
    return None
