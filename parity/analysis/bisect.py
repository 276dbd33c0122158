"""Bisection: from "this mode drifted" to the buffer and bug class that explain it.

1. Localise: drive an eager engine and a graph engine of the same build in
   lockstep over the same schedule; the first forward whose outputs (logits,
   draft tokens, draft hidden states, KV cache) differ beyond tolerance is the
   divergence. Target outputs are also re-checked at the end of every step, so
   a drafter replay that overwrites them (a shared pool) is caught.
2. Audit that forward: the graph's capture manifest against the live registry
   (another address: reassigned), the captured buffers against the values the
   eager forward used (same address, other values: stale), padded entries
   against inert values (padding leak).
3. Confirm causally: repair suspects in the captured buffers and replay;
   delta-debug to the smallest set that restores parity. When no buffer
   explains it, re-capture under the live context: if that restores parity the
   graph baked something at capture, either whole metadata tensors (capture
   context) or Python values (frozen at capture), delta-debugged field by field.
4. Otherwise NUMERIC_NOISE when tokens agree within tolerance, else UNKNOWN
   with the localisation found. Never a guess.

The bisector sees only engines and their graphs: it never reads which bugs
were switched on when an engine was built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from parity.analysis.delta_debug import ddmin
from parity.engine.buffers import ROW_BUFFERS, ROW_PLUS_ONE_BUFFERS, TOKEN_BUFFERS
from parity.graphs.capture import capture
from parity.graphs.context import forward_context
from parity.graphs.manager import python_fields, restore_tensors, snapshot_tensors
from parity.graphs.modes import EAGER

METADATA_FIELDS = ("query_start_loc", "seq_lens", "slot_mapping", "block_table", "positions", "window_start")


@dataclass
class Diagnosis:
    kind: str
    buffers: list[str]
    mode: str
    owner: str | None = None
    step: int | None = None
    phase: str | None = None
    draft_step: int | None = None
    forward_index: int | None = None
    rows: list[int] = field(default_factory=list)
    graph: dict | None = None
    captured_address: int | None = None
    live_address: int | None = None
    evidence: list[str] = field(default_factory=list)
    replays: int = 0
    max_abs_diff: float | None = None
    timing: dict | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Replays:
    def __init__(self):
        self.count = 0


def _owner_parts(engine, owner: str):
    if owner == "target":
        return engine.target, engine.target_executor, engine.target.forward
    return engine.proposer, engine.drafter_executor, None


def bisect_mode(make_engine, specs, mode: str, backend: str, scenario, tolerance: float = 1e-3) -> Diagnosis:
    """Diagnose why `mode` drifts from eager for engines built by `make_engine`."""
    from parity.graphs.factory import install_graphs

    def reference(engine):
        install_graphs(engine, "eager", backend)

    def graphs(engine):
        install_graphs(engine, mode, backend, scenario.capture_sizes, scenario.drafter_mode,
                       scenario.shared_drafter_pool)

    return Bisector(make_engine, reference, graphs, specs, mode, tolerance).run()


def _forward_fn(engine, phase: str):
    if phase == "verify":
        return engine.target.forward
    return engine.proposer.prefill_forward if phase == "draft_prefill" else engine.proposer.step_forward


def _state_tensors(engine) -> list[torch.Tensor]:
    tensors = [t for _, t in engine.target.buffers.items()] + engine.target.kv_cache.tensors()
    if engine.proposer is not None:
        tensors += [t for _, t in engine.proposer.buffers.items()] + engine.proposer.kv_cache.tensors()
    return tensors


def _meta_tensors(meta) -> dict[str, torch.Tensor]:
    return {name: getattr(meta, name) for name in METADATA_FIELDS}


def _snapshot(engine, meta):
    live = _state_tensors(engine)
    meta_tensors = _meta_tensors(meta)
    return {"live": live, "saved": snapshot_tensors(live),
            "meta": {k: v.clone() for k, v in meta_tensors.items()}, "meta_live": meta_tensors}


def _restore(snap) -> None:
    restore_tensors(snap["live"], snap["saved"])
    for name, tensor in snap["meta_live"].items():
        tensor.copy_(snap["meta"][name])


def _outputs(engine, event, logits=None) -> dict[str, torch.Tensor]:
    """What a forward produced, over its real rows only (`logits`: another graph's output)."""
    n, t = event.num_rows, event.dispatch.num_tokens
    if event.owner == "target":
        out = {"logits": (event.logits if logits is None else logits)[:t].float().clone()}
        kv = engine.target.kv_cache
    else:
        b = engine.proposer.buffers
        j = event.draft_step
        out = {"draft_tokens": b["draft_tokens"][:n, j].clone(), "draft_logprobs": b["draft_logprobs"][:n, j].clone(),
               "input_ids": b["input_ids"][:n].clone(), "hidden_states": b["hidden_states"][:n].float().clone()}
        kv = engine.proposer.kv_cache
    for i, tensor in enumerate(kv.tensors()):
        out[f"kv{i}"] = tensor[:-1].float().clone()   # the trash row is padding's sink
    return out


def _max_diff(a: dict, b: dict) -> tuple[float, list[str]]:
    worst, names = 0.0, []
    for name in a:
        x, y = a[name], b[name]
        if x.dtype in (torch.int64, torch.int32):
            d = float((x != y).any())
            d = float("inf") if d else 0.0
        else:
            d = float((x - y).abs().max()) if x.numel() else 0.0
        if d > 0:
            names.append(name)
        worst = max(worst, d)
    return worst, names


def _diff_rows(a: dict, b: dict, tol: float) -> list[int]:
    for name in ("logits", "hidden_states", "draft_tokens"):
        if name in a:
            x, y = a[name].float(), b[name].float()
            delta = (x - y).abs()
            per_row = delta.reshape(delta.shape[0], -1).amax(dim=1) if delta.dim() > 1 else delta
            return [int(i) for i in torch.nonzero(per_row > tol).flatten().tolist()]
    return []


def _region(name: str, dispatch):
    t, r = dispatch.num_tokens, dispatch.num_reqs
    if name in TOKEN_BUFFERS:
        return slice(0, t)
    if name in ROW_PLUS_ONE_BUFFERS:
        return slice(0, r + 1)
    if name in ROW_BUFFERS:
        return slice(0, r)
    return slice(None)


_INERT = {"slot_mapping": lambda d: -1, "seq_lens": lambda d: 0, "query_start_loc": lambda d: d.num_tokens}


def _padding_region(name: str, dispatch):
    if name in TOKEN_BUFFERS:
        return slice(dispatch.num_tokens, dispatch.num_tokens_padded)
    if name in ROW_PLUS_ONE_BUFFERS:
        return slice(dispatch.num_reqs + 1, dispatch.num_reqs_padded + 1)
    return slice(dispatch.num_reqs, dispatch.num_reqs_padded)


class Bisector:
    """Lockstep localisation and root-cause analysis of one graph mode."""

    def __init__(self, make_engine, install_reference, install_graph, specs, mode: str, tolerance: float = 1e-3):
        self.make_engine = make_engine
        self.install_reference = install_reference
        self.install_graph = install_graph
        self.specs = specs
        self.mode = mode
        self.tol = tolerance
        self.replays = _Replays()

    # --- 1. localise -------------------------------------------------------------

    @torch.no_grad()
    def run(self) -> Diagnosis:
        ref, graph = self.make_engine(), self.make_engine()
        self.install_reference(ref)
        self.install_graph(graph)
        gen_ref, gen_graph = ref.events(self.specs), graph.events(self.specs)
        snaps = {}
        target_out = None   # (graph logits tensor, eager logits copy, verify event)
        overwritten_by = None
        for ev_r, ev_g in zip(gen_ref, gen_graph):
            if (ev_r.kind, ev_r.step, ev_r.phase, ev_r.draft_step) != (ev_g.kind, ev_g.step, ev_g.phase, ev_g.draft_step):
                return self._diagnosis("UNKNOWN", [], ev_g, evidence=[
                    "the two runs' schedules parted without a forward's outputs differing first"])
            if ev_g.kind == "pre":
                snaps = {"ref": _snapshot(ref, ev_r.meta), "graph": _snapshot(graph, ev_g.meta)}
                continue
            if ev_g.kind == "step_end":
                if target_out is not None:
                    logits_g, logits_r, verify_event = target_out
                    t = verify_event.dispatch.num_tokens
                    drift = float((logits_g[:t].float() - logits_r).abs().max())
                    if drift > self.tol:
                        return self._pool_alias(graph, verify_event, overwritten_by, drift, logits_r)
                target_out, overwritten_by = None, None
                continue
            out_r, out_g = _outputs(ref, ev_r), _outputs(graph, ev_g)
            worst, names = _max_diff(out_r, out_g)
            if worst > self.tol:
                return self._analyse(ref, graph, ev_r, ev_g, snaps, out_r, worst, names)
            if ev_g.phase == "verify":
                target_out = (ev_g.logits, out_r["logits"], ev_g)
            elif target_out is not None and overwritten_by is None:
                t = target_out[2].dispatch.num_tokens
                if float((target_out[0][:t].float() - target_out[1]).abs().max()) > self.tol:
                    overwritten_by = ev_g
        return Diagnosis("NONE", [], self.mode, evidence=["every forward matched eager within tolerance"],
                         replays=self.replays.count)

    # --- 2 + 3. audit and confirm ------------------------------------------------------

    def _analyse(self, ref, graph, ev_r, ev_g, snaps, out_r, worst, names) -> Diagnosis:
        self._ref, self._ev_r = ref, ev_r
        dispatch = ev_g.dispatch
        rows = _diff_rows(out_r, _outputs(graph, ev_g), self.tol)
        if dispatch.runtime_mode == EAGER:
            return self._diagnosis("UNKNOWN", [], ev_g, rows=rows, max_abs_diff=worst, evidence=[
                f"first divergence in an eager forward of the {self.mode} run ({', '.join(names)} differ): "
                "state left by an earlier graph replay, not a buffer read by this one"])
        _, executor, _ = _owner_parts(graph, ev_g.owner)
        entry = executor.graphs[(dispatch.phase, dispatch.runtime_mode, dispatch.descriptor)]
        graph_info = {"runtime_mode": dispatch.runtime_mode, "num_tokens": dispatch.num_tokens_padded,
                      "num_reqs": dispatch.num_reqs_padded,
                      "manifest": [e.as_dict() for e in entry.manifest]}
        registry = {name: t for name, t in (graph.target.buffers if ev_g.owner == "target"
                                            else graph.proposer.buffers).items()}
        ref_meta = snaps["ref"]["meta"]
        ref_state = dict(zip([id(t) for t in snaps["ref"]["live"]], snaps["ref"]["saved"]))
        ref_registry = (ref.target.buffers if ev_r.owner == "target" else ref.proposer.buffers)
        graph_state = dict(zip([id(t) for t in snaps["graph"]["live"]], snaps["graph"]["saved"]))

        def eager_value(name):
            if name in ref_meta:
                return ref_meta[name]
            live = ref_registry[name]
            return ref_state.get(id(live), live)

        suspects = []   # (kind, name, repair)
        for e in entry.manifest:
            captured = e.tensor
            before = graph_state.get(id(captured))
            if before is None:   # a tensor no longer registered (reassigned): its value is as it is
                before = captured
            live = registry.get(e.name)
            region = _region(e.name, dispatch)
            used = eager_value(e.name)
            if region.stop is not None and (used.shape[0] < region.stop or before.shape[0] < region.stop):
                continue
            if live is not None and live.data_ptr() != e.address:
                suspects.append(("BUFFER_REASSIGNED", e.name, (captured, region, used[region])))
            elif before[region].shape == used[region].shape and not torch.equal(before[region], used[region]):
                suspects.append(("STALE_BUFFER", e.name, (captured, region, used[region])))
        for name, inert in _INERT.items():
            region = _padding_region(name, dispatch)
            if region.stop <= region.start:
                continue
            for tensor in {id(t): t for t in (registry.get(name), getattr(ev_g.meta, name))
                           if t is not None}.values():
                before = graph_state.get(id(tensor), tensor)
                if before.dim() and (before[region] != inert(dispatch)).any():
                    fill = torch.full_like(before[region], inert(dispatch))
                    suspects.append(("PADDING_LEAK", name, (tensor, region, fill)))
        fn = _forward_fn(graph, ev_g.phase)
        # A buffer flagged twice (padding and value) is repaired by both entries.
        suspects = list({(k, n, id(r[0])): (k, n, r) for k, n, r in suspects}.values())

        def replay_with(subset) -> bool:
            _restore(snaps["graph"])
            for _, _, (tensor, region, value) in subset:
                tensor[region].copy_(value)
            return self._replay_matches(graph, ev_g, executor, fn, out_r)

        if suspects and replay_with(suspects):
            culprits = ddmin(suspects, replay_with)
            kind = _dominant(culprits)
            names_ = sorted({name for _, name, _ in culprits})
            first = next(e for e in entry.manifest if e.name == names_[0]) if any(
                e.name == names_[0] for e in entry.manifest) else None
            live = registry.get(names_[0])
            evidence = [f"{k.lower()}: {n}" for k, n, _ in culprits]
            evidence.append(f"copying eager's values of {', '.join(names_)} into the captured buffers "
                            "and replaying restores parity")
            return self._diagnosis(kind, names_, ev_g, rows=rows, graph=graph_info, max_abs_diff=worst,
                                   captured=first.address if first else None,
                                   live=live.data_ptr() if live is not None else None, evidence=evidence)
        return self._recapture(graph, ev_g, snaps, out_r, entry, executor, fn, rows, graph_info, worst, suspects)

    def _recapture(self, graph, ev_g, snaps, out_r, entry, executor, fn, rows, graph_info, worst, suspects):
        """Re-capture under the live context: restores parity iff the graph baked something in."""
        dispatch = ev_g.dispatch
        live_meta = ev_g.meta
        live_fields = python_fields(live_meta)

        def recaptured_matches(meta) -> tuple[bool, object]:
            _restore(snaps["graph"])
            pool = executor.backend.new_pool("bisect")
            with forward_context(meta):
                g = capture(executor.backend, pool, lambda: fn(dispatch.num_tokens_padded, dispatch.num_reqs_padded),
                            piecewise=dispatch.runtime_mode == "piecewise", weak_outputs=False)
            _restore(snaps["graph"])
            self.replays.count += 1
            with forward_context(live_meta):
                outputs = g.replay()
            return self._outputs_match(graph, ev_g, out_r, outputs[0] if outputs else None), g

        restored, fresh = recaptured_matches(live_meta)
        if not restored:
            evidence = ["no buffer repair and no re-capture restores parity"]
            if suspects:
                evidence.append("suspects that did not explain it: " + ", ".join(sorted({n for _, n, _ in suspects})))
            evidence += self._probe_layers(self._ref, graph, self._ev_r, ev_g, snaps)
            kind = "NUMERIC_NOISE" if self._tokens_agree(out_r, _outputs(graph, ev_g)) and worst <= 10 * self.tol \
                else "UNKNOWN"
            if kind == "NUMERIC_NOISE":
                evidence.append(f"tokens agree and the largest delta ({worst:.3g}) stays within 10x tolerance")
            return self._diagnosis(kind, [], ev_g, rows=rows, graph=graph_info, max_abs_diff=worst, evidence=evidence)
        from parity.graphs.manifest import build_manifest

        registries = executor.registries
        old = {e.name for e in entry.manifest}
        new = {e.name for e in build_manifest(fresh.read_storages, registries)}
        missing = sorted((new - old) & set(METADATA_FIELDS))
        if missing:
            return self._diagnosis("CAPTURE_CONTEXT", missing, ev_g, rows=rows, graph=graph_info, max_abs_diff=worst,
                                   evidence=[f"the graph never read the live {', '.join(missing)}: it was captured "
                                             "with other metadata tensors",
                                             "re-capturing under the live forward context restores parity"])
        captured = entry.captured_with
        candidates = sorted(k for k in live_fields if _differs(captured.get(k), live_fields[k]))

        def with_live(subset) -> bool:
            hybrid = dataclasses.replace(live_meta, **{k: captured[k] for k in captured if k not in subset})
            return recaptured_matches(hybrid)[0]

        frozen = ddmin(candidates, with_live) if candidates and with_live(candidates) else []
        if not frozen:
            return self._diagnosis("FROZEN_AT_CAPTURE", [], ev_g, rows=rows, graph=graph_info, max_abs_diff=worst,
                                   evidence=["re-capturing under the live context restores parity, but no single "
                                             "Python value of the metadata explains it"])
        return self._diagnosis("FROZEN_AT_CAPTURE", frozen, ev_g, rows=rows, graph=graph_info, max_abs_diff=worst,
                               evidence=[f"{k}: captured {_short(captured.get(k))}, live {_short(live_fields[k])}"
                                         for k in frozen] +
                                        [f"re-capturing with the live {', '.join(frozen)} restores parity"])

    def _pool_alias(self, graph, verify_event, overwritten_by, drift, logits_r) -> Diagnosis:
        evidence = [f"target logits matched eager after the verify forward, then changed by {drift:.3g} "
                    "before the step's end"]
        if overwritten_by is not None:
            d = overwritten_by.dispatch
            evidence.append(f"they changed during the {d.phase} replay (draft step {overwritten_by.draft_step}, "
                            f"{d.runtime_mode} graph of {d.num_tokens_padded} tokens)")
            # Causal check: restore the target output, replay the suspect drafter graph once more.
            logits = verify_event.logits
            t = verify_event.dispatch.num_tokens
            saved = _state_tensors(graph)
            keep = snapshot_tensors(saved)
            logits[:t].copy_(logits_r.to(logits.dtype))
            executor = graph.drafter_executor
            entry = executor.graphs.get((d.phase, d.runtime_mode, d.descriptor))
            if entry is not None:
                self.replays.count += 1
                with forward_context(overwritten_by.meta):
                    entry.graph.replay()
                changed = float((logits[:t].float() - logits_r).abs().max()) > self.tol
                restore_tensors(saved, keep)
                if changed:
                    evidence.append("replaying that drafter graph alone overwrites the restored target logits: "
                                    "its temporaries share memory with the target's output")
        return self._diagnosis("POOL_ALIAS", ["logits"], verify_event, max_abs_diff=drift, evidence=evidence)

    # --- 4. probes ---------------------------------------------------------------------------

    def _probe_layers(self, ref, graph, ev_r, ev_g, snaps) -> list[str]:
        """Layer probes: the divergent forward re-run eagerly in both engines from their
        pre-forward state, decoder layer by decoder layer.

        A first layer that differs means the state the forward starts from already
        differs there; no layer differing means the inputs are right and the
        difference is made inside the captured graph's replay.
        """
        ours = self._layer_outputs(graph, ev_g, snaps["graph"])
        theirs = self._layer_outputs(ref, ev_r, snaps["ref"])
        t = ev_g.dispatch.num_tokens
        for i, (a, b) in enumerate(zip(ours, theirs)):
            delta = float((a[:t] - b[:t]).abs().max())
            if delta > self.tol:
                return [f"layer probe: decoder layer {i} is the first to differ ({delta:.3g}) when the forward "
                        "re-runs eagerly from each run's state: the state before this forward already differs"]
        return [f"layer probe: all {len(ours)} decoder layer(s) agree when the forward re-runs eagerly from the "
                "graph run's state: the difference is made inside the captured graph's replay"]

    def _layer_outputs(self, engine, event, snap) -> list[torch.Tensor]:
        outputs: list[torch.Tensor] = []
        layers = engine.target.model.hf.model.layers if event.owner == "target" else engine.proposer.head.layers

        def keep(module, args, out):
            hidden = out[0] if isinstance(out, tuple) else out
            outputs.append(hidden.detach().float().reshape(-1, hidden.shape[-1]).clone())

        hooks = [layer.register_forward_hook(keep) for layer in layers]
        try:
            _restore(snap)
            self.replays.count += 1
            with forward_context(event.meta):
                _forward_fn(engine, event.phase)(event.dispatch.num_tokens_padded, event.dispatch.num_reqs_padded)
        finally:
            for hook in hooks:
                hook.remove()
        return outputs

    @staticmethod
    def _tokens_agree(out_r: dict, out_g: dict) -> bool:
        if "logits" in out_r:
            return torch.equal(out_r["logits"].argmax(-1), out_g["logits"].argmax(-1))
        return torch.equal(out_r["draft_tokens"], out_g["draft_tokens"])

    # --- helpers -------------------------------------------------------------------------

    def _replay_matches(self, graph, ev_g, executor, fn, out_r) -> bool:
        self.replays.count += 1
        with forward_context(ev_g.meta):
            executor.execute(ev_g.dispatch, fn)
        return self._outputs_match(graph, ev_g, out_r)

    def _outputs_match(self, graph, ev_g, out_r, logits=None) -> bool:
        worst, _ = _max_diff(out_r, _outputs(graph, ev_g, logits))
        return worst <= self.tol

    def _diagnosis(self, kind, buffers, event, rows=(), graph=None, max_abs_diff=None, captured=None, live=None,
                   evidence=()) -> Diagnosis:
        return Diagnosis(kind, list(buffers), self.mode, owner=event.owner, step=event.step, phase=event.phase,
                         draft_step=event.draft_step, forward_index=event.index, rows=list(rows), graph=graph,
                         captured_address=captured, live_address=live, evidence=list(evidence),
                         replays=self.replays.count, max_abs_diff=max_abs_diff)


def _dominant(culprits) -> str:
    order = ("BUFFER_REASSIGNED", "PADDING_LEAK", "STALE_BUFFER")
    kinds = {k for k, _, _ in culprits}
    return next(k for k in order if k in kinds)


def _differs(a, b) -> bool:
    return a != b


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
