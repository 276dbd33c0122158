"""Lockstep localisation of the first divergent forward, then the stages that explain it."""

from __future__ import annotations

import dataclasses

import torch

from parity.diagnosis.kinds import NONE, SHORT_BUFFER, UNEXPLAINED
from parity.audit import handed, repairs
from parity.diagnose import (capture_error, descriptor, host_moves, lifetime, padding, pool, rebound, recapture,
                             reproducible)
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence, diagnosis_at, run_stages
from parity.audit.state import delta
from parity.diagnose.state import diff_rows, max_diff, outputs, snapshot
from parity.engine.spec_decode import RunEvents
from parity.graphs import host_state
from parity.graphs.capacity import ShortBuffers
from parity.graphs.capture_errors import CaptureError
from parity.graphs.descriptor import WrongGraph
from parity.graphs.factory import install_graphs, install_padded_reference
from parity.graphs.manager import GraphExecutor
from parity.graphs.modes import EAGER
from parity.graphs.policy import CapturePolicy
from parity.graphs.tp_agree import agree_any, first_found


def bisect_mode(make_engine, specs, mode: str, backend: str, scenario, policy: CapturePolicy,
                graph_matches_clean_reference: bool = False) -> Diagnosis:
    """Diagnose why `mode` differs from its strict padded reference, for engines built by `make_engine`.

    First the graphs against the reference on clean padding (graph bugs); when
    they agree throughout, the reference on clean padding against the
    reference on poisoned padding (padding leaks). Every comparison is bit for bit.
    """

    def reference(poison: bool):
        return lambda engine: install_padded_reference(engine, mode, scenario.capture_sizes, scenario.drafter_mode,
                                                       poison=poison)

    def graphs(engine, copied=()):
        install_graphs(engine, mode, backend, scenario.capture_sizes, scenario.drafter_mode,
                       dataclasses.replace(policy, copied_outputs=tuple(copied)))

    diagnosis = Diagnosis(NONE, [], mode)
    if not graph_matches_clean_reference:
        try:
            diagnosis = Bisector(make_engine, reference(False), graphs, specs, mode).run()
        except ShortBuffers as short:     # the capacity audit refused the mode before anything was captured
            return short_buffer_diagnosis(mode, short.shortfalls)
        except CaptureError as error:     # a graph of the mode cannot be captured at all
            return capture_error.diagnose(mode, error)
    if diagnosis.kind == NONE:
        first = diagnosis
        diagnosis = PaddingBisector(make_engine, reference(False), reference(True), specs, mode).run()
        diagnosis.replays += first.replays
        if diagnosis.kind == NONE:    # what the graph stage saw and tried still stands
            diagnosis.evidence = first.evidence + diagnosis.evidence
            diagnosis.ruled_out = first.ruled_out + diagnosis.ruled_out
    return diagnosis


def short_buffer_diagnosis(mode: str, shortfalls) -> Diagnosis:
    """SHORT_BUFFER from the capacity audit's findings: each buffer, its capacity and the padded shape."""
    first = shortfalls[0]
    owners = list(dict.fromkeys(s.owner for s in shortfalls))
    return Diagnosis(SHORT_BUFFER, list(dict.fromkeys(s.buffer for s in shortfalls)), mode,
                     owner=", ".join(owners), phase=first.phase,
                     graph={"runtime_mode": first.runtime_mode, "num_tokens": first.num_tokens,
                            "num_reqs": first.num_reqs},
                     evidence=[s.describe() for s in shortfalls],
                     experiment="capacity audit before capture: every batch-indexed buffer against every padded "
                                "shape the dispatcher pads to; a slice past a buffer's end is a short tensor")


class Bisector:
    """Drives an eager and a graph engine in lockstep and diagnoses the first divergence."""

    def __init__(self, make_engine, install_reference, install_graph, specs, mode: str):
        self.make_engine = make_engine
        self.install_reference = install_reference
        self.install_graph = install_graph
        self.specs = specs
        self.mode = mode
        self.replays = 0     # forwards re-run to test a hypothesis

    @torch.no_grad()
    def run(self) -> Diagnosis:
        ref, graph = self.make_engine(), self.make_engine()
        self.install_reference(ref)
        self.install_graph(graph)
        snaps, pre = {}, None
        target_out = None   # (graph logits tensor, eager logits copy, verify event)
        overwritten_by = None
        ref_events, graph_events = RunEvents(ref.events(self.specs)), RunEvents(graph.events(self.specs))
        for ev_r in ref_events:
            if pre is not None and "graph" not in snaps:
                # NOTE: the graph run's pre-state is taken once the reference's forward ran, just before its own:
                # state the two runs share (a workspace of the model both hold) is then what the graph started from.
                snaps["graph"] = snapshot(graph, pre.meta, pre.owner)
            try:
                ev_g = next(graph_events)
            except StopIteration:
                break
            except WrongGraph as wrong:    # the replay check stopped the graph run before the graph ran
                lab = self.divergence(ref, graph, ev_r, pre, snaps, outputs(ref, ev_r), {})
                return self._counted(lab, descriptor.stopped(lab, wrong))
            # NOTE: under TP every decision below is the ranks' common one (`graphs.tp_agree`): their next
            # forwards, and the collectives in them, must pair up; at TP=1 each agreement is the value itself.
            parted = (ev_r.kind, ev_r.step, ev_r.phase, ev_r.draft_step) != (ev_g.kind, ev_g.step, ev_g.phase,
                                                                             ev_g.draft_step)
            if agree_any("lockstep: schedules part", parted):
                return self.diagnosis(UNEXPLAINED, [], ev_g, evidence=[
                    "the two runs' schedules parted without a forward's outputs differing first"])
            if ev_g.kind == "pre":
                snaps, pre = {"ref": snapshot(ref, ev_r.meta, ev_r.owner)}, ev_g
                continue
            if ev_g.kind == "step_end":
                if target_out is not None:
                    drift = _logits_drift(*target_out)
                    if agree_any("lockstep: target logits changed by the step's end", drift > 0):
                        logits_g, logits_r, verify_event = target_out
                        return pool.diagnose(self, graph, verify_event, overwritten_by, drift, logits_r)
                target_out, overwritten_by = None, None
                continue
            out_r, out_g = outputs(ref, ev_r), outputs(graph, ev_g)
            worst, names = max_diff(out_r, out_g)
            if agree_any("lockstep: forward differs", worst > 0):
                return self._explain(ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst, names)
            if ev_g.phase == "verify":
                target_out = (ev_g.logits, out_r["logits"], ev_g)
            elif target_out is not None and overwritten_by is None and agree_any(
                    "lockstep: target logits changed", _logits_drift(*target_out) > 0):
                overwritten_by = ev_g
        next(graph_events, None)    # the reference ended: let the graph run finish too
        found = self.after_the_forwards(graph, ref_events.result, graph_events.result)
        if found is not None:
            return found
        return Diagnosis(NONE, [], self.mode, evidence=[f"every forward matched bit for bit ({self.matched})"],
                         replays=self.replays)

    def after_the_forwards(self, graph, ref_result, graph_result):
        """Every forward matched: do the records? Outputs read after a later replay (OUTPUT_ALIASED)."""
        first = lifetime.records_differ(ref_result, graph_result) if ref_result and graph_result else None
        first, _ = first_found("lockstep: records differ", first)
        return None if first is None else lifetime.diagnose(self, graph.owners(), ref_result, first)

    matched = "graphs and their padded reference"

    def _explain(self, ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst, names) -> Diagnosis:
        lab = self.divergence(ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst)
        return self._counted(lab, self.stages(lab, names))

    def stages(self, lab: Divergence, names: list[str]) -> Diagnosis:
        """The diagnosis of the divergent forward (`names`: its outputs that differ)."""
        if lab.entry is not None:
            return run_stages(lab, GRAPH_STAGES)
        return run_stages(lab, EAGER_STAGES) or lab.diagnosis(UNEXPLAINED, [], evidence=[
            f"first divergence in an eager forward of the {self.mode} run ({', '.join(names)} differ): "
            "state left by an earlier graph replay, not a buffer read by this one"])

    def _counted(self, lab: Divergence, found: Diagnosis) -> Diagnosis:
        """`found`, counting every forward re-run so far (the lab's experiments included)."""
        self.replays += lab.replays
        found.replays = self.replays
        return found

    def divergence(self, ref, graph, ev_r, ev_g, snaps, out_r, out_g, worst=None) -> Divergence:
        """The forward at which the two runs part, as the stages take it (call it before anything re-runs a
        forward: the runs stand just after it, so what it moved on the host is still to be seen)."""
        where = {"rows": diff_rows(out_r, out_g), "max_abs_diff": worst} if worst is not None else {}
        lab = Divergence(self.mode, ref, graph, ev_r, ev_g, snaps, out_r, out_g, where)
        if ev_g.kind != "pre":
            holder, values = snaps["ref"]["host"][ev_r.owner]
            lab.moves = host_state.moved(values, holder)
        if ev_g.kind != "pre" and ev_g.dispatch.runtime_mode != EAGER and isinstance(lab.executor, GraphExecutor):
            lab.entry = lab.executor.entry(ev_g.dispatch)
            lab.where["graph"] = _graph_info(ev_g.dispatch, lab.entry)
        return lab

    def diagnosis(self, kind, buffers, event, **fields) -> Diagnosis:
        """A run-level diagnosis at `event`'s forward (`fields`: evidence, experiment, ruled_out...)."""
        return diagnosis_at(self.mode, event, kind, buffers, self.replays, **fields)


class PaddingBisector(Bisector):
    """The reference on clean padding (as `ref`) against the reference on poisoned padding (as `graph`)."""

    matched = "the padded reference on clean and on poisoned padding"

    def after_the_forwards(self, graph, ref_result, graph_result):
        return None     # both runs are references: their outputs are fresh tensors

    def stages(self, lab: Divergence, names: list[str]) -> Diagnosis:
        return padding.stage(lab)


# The stages a divergent forward goes through, in order; the first diagnosis stands. The last always gives one.
GRAPH_STAGES = (reproducible.stage, descriptor.stage, handed.stage, repairs.stage, rebound.piecewise_outputs,
                handed.pointed_back, recapture.stage)
EAGER_STAGES = (host_moves.stage,)


def _graph_info(dispatch, entry) -> dict:
    return {"runtime_mode": dispatch.runtime_mode, "num_tokens": dispatch.num_tokens_padded,
            "num_reqs": dispatch.num_reqs_padded,
            # the weights it read are counted, not listed (hundreds at 8B)
            "manifest": [e.as_dict() for e in entry.manifest if not _weight(e)],
            "weights_read": sum(_weight(e) for e in entry.manifest)}


def _weight(entry) -> bool:
    return isinstance(entry.tensor, torch.nn.Parameter)


def _logits_drift(logits_g, logits_r, verify_event) -> float:
    t = verify_event.dispatch.num_tokens
    return float(delta(logits_g[:t], logits_r).max())
