"""PADDING_LEAK: the strict padded reference changes when only its padding is poisoned.

Localised by driving the reference on clean padding and the reference on
poisoned padding in lockstep (`PaddingBisector`); at the first forward whose
real outputs differ, first what its indices say (`routing.overwrite_diagnosis`,
read during the plain re-run of 2. below: padded rows of an indexed write
targeting what a live row targets name the write's index buffer, with no
experiment), then three experiments, each changing one thing:

1. the padding contract as the builder left it: padded entries of INERT
   buffers (PAD slots, zero seq_lens, clamped query_start_loc) that do not
   hold their pad value;
2. side effects: KV slots the padded tokens write, found by re-running the
   forward from its clean pre-state (`padded_kv_writes`);
3. repair: the poisoned forward re-run with the breached entries set to their
   pad values, delta-debugged to the smallest set that restores bitwise parity
   with the clean forward. When no contract entry explains it, each FREE
   padded input is poisoned alone on the clean state: the ones that change
   real outputs are named.

When the breach is a draft step's, one more experiment asks where it came
from (`engine.padding_regions.advance_origin`): padded rows held at their registered pad values are
advanced one step by the owner's own builder, on a copy; a padded entry that
leaves its pad value means the contract itself is not a fixed point of the
builder, and the field whose empty value (0) keeps every entry at its pad is
named with the breach.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from parity.diagnosis.kinds import PADDING_LEAK, UNEXPLAINED
from parity.audit.delta_debug import ddmin
from parity.diagnosis.record import Diagnosis
from parity.diagnose.lab import Divergence
from parity.audit.ranks import shared
from parity.audit.state import rows_apart
from parity.diagnose.repairs import breaches
from parity.diagnose.routing import overwrite_diagnosis, recorder_of
from parity.diagnose.state import max_diff
from parity.engine.buffers import FREE, fill_like_live, poison_padding
from parity.engine.padding_regions import advance_origin
from parity.graphs.tp_agree import agree_all, agree_any, agree_same, agree_union


def padded_kv_writes(lab: Divergence, run: str, watch=None) -> list[int]:
    """KV slots padded tokens write in `run` ("ref" or "graph"), each found by re-running the forward from
    its pre-state (the plain re-run under `watch`, a recorder, when given).

    1. rows the forward changes that no real token of the batch owns;
    2. first-layer rows that change when only the padded tokens' FREE inputs are
       poisoned (a real token's first-layer key and value depend on its own row
       alone, so any row that moves was written by a padded token, a real
       request's own slot included);
    3. when the padded slot entries are off PAD, rows that change once they are
       set to PAD.
    The trash row (the last) is where padded writes belong and is never counted.
    """
    engine, event = lab.side(run)
    owner = engine.owner(event.owner)
    lab.restore(run)
    # The real tokens' slots, as the persistent buffer (what a graph reads) and the metadata object (what an
    # eager forward reads; a rebound field makes the two differ) hold them.
    n = event.dispatch.num_tokens
    real = set(owner.buffers["slot_mapping"][:n].tolist())
    live = getattr(event.meta, "slot_mapping", None)
    if isinstance(live, torch.Tensor):
        real |= set(live[:n].tolist())
    before = _kv_rows(owner)

    def rerun(change=None) -> list[torch.Tensor]:
        lab.run(change, side=run)
        return _kv_rows(owner)

    def set_pad_slots():
        for _, tensor, region, _ in _slot_breaches(owner, event):
            tensor[region] = -1

    with watch if watch is not None else nullcontext():
        plain = rerun()
    written = _changed(before, plain) - real
    poisoned = rerun(lambda: poison_padding(owner.buffers, event.dispatch, salt=1))
    layers = len(owner.kv_cache.keys)
    written |= _changed(plain[:1] + plain[layers:layers + 1], poisoned[:1] + poisoned[layers:layers + 1])
    lab.restore(run)
    if agree_any("padded KV writes: slot entries off PAD", bool(_slot_breaches(owner, event))):
        written |= _changed(plain, rerun(set_pad_slots))      # a no-op re-run on a rank with none
    lab.restore(run)
    return sorted(written)


def padded_writes(lab: Divergence, tag: str) -> tuple[list[int], Diagnosis | None]:
    """Before any experiment: the real KV slots the reference's padded tokens write (every rank's), and when none,
    PADDING_LEAK naming what its indexed writes' padded rows overwrite (`routing.overwrite_diagnosis`)."""
    recorder = recorder_of(lab)
    stray = agree_union(f"{tag}: padded KV writes", padded_kv_writes(lab, "ref", watch=recorder))
    return stray, None if stray else shared(f"{tag}: padded overwrites", overwrite_diagnosis(lab, recorder))


def _kv_rows(owner) -> list[torch.Tensor]:
    return [t[:-1].clone() for t in owner.kv_cache.tensors()]


def _changed(old: list[torch.Tensor], new: list[torch.Tensor]) -> set[int]:
    return {row for a, b in zip(old, new) for row in rows_apart(a, b)}


def _slot_breaches(owner, event):
    return [b for b in breaches(owner.buffers, event.meta, event.dispatch) if b[0] == "slot_mapping"]


def stage(lab: Divergence) -> Diagnosis:
    """The padding stage, on a lab whose reference (`ref`) is the padded reference on clean padding and whose
    run under test (`graph`) is the same reference on poisoned padding."""
    ev_p = lab.ev_g
    owner = lab.graph.owner(ev_p.owner)
    dispatch = ev_p.dispatch
    evidence = [f"the padded reference's real outputs change when only its padded inputs are poisoned "
                f"({dispatch.num_tokens} real of {dispatch.num_tokens_padded} tokens, {dispatch.num_reqs} real of "
                f"{dispatch.num_reqs_padded} rows)"]
    lab.restore()
    found = breaches(owner.buffers, ev_p.meta, dispatch)
    # NOTE: under TP the breaches are of metadata every rank builds alike: ranks that differ part here.
    agree_same("padding: breaches", [[name, off] for name, _, _, off in found])
    evidence += [f"{name}: {off} padded entr{'y' if off == 1 else 'ies'} not at the inert value "
                 f"{owner.buffers.spec(name).inert_value(dispatch.num_tokens)}" for name, _, _, off in found]
    stray, overwritten = padded_writes(lab, "padding")
    if overwritten is not None:
        overwritten.evidence = evidence + overwritten.evidence
        return overwritten
    if stray:
        evidence.append(f"padded tokens write the KV cache of real requests: slots {slot_list(stray)}")

    def repaired(subset) -> bool:
        """Both references with the subset's padded entries set inert: do they agree again (on every rank)?"""
        same = _run_repaired(lab, "ref", subset) == _run_repaired(lab, "graph", subset)
        return agree_all("padding: repaired", same)

    if found and repaired(found):
        culprits = ddmin(found, repaired)
        names = sorted({c[0] for c in culprits})
        experiment = (f"set the padded entries of {', '.join(names)} to their inert values in both references: "
                      "bitwise parity between the poisoned and the clean reference is restored")
        evidence.append(experiment)
        if ev_p.phase == "draft_step":
            origin, origin_evidence = advance_origin(owner, ev_p.dispatch, ev_p.meta)
            evidence += origin_evidence
            names = sorted(set(names) | set(origin))
        return lab.diagnosis(PADDING_LEAK, names, evidence=evidence, experiment=experiment)
    if stray:
        evidence.append("the padded tokens' slot entries hold PAD, yet they write real KV slots: the write path "
                        "does not keep PAD writes in the trash row")
        return lab.diagnosis(PADDING_LEAK, ["slot_mapping"], evidence=evidence,
                             experiment="re-run the forward from its clean pre-state, its padded inputs "
                                        "poisoned: the KV slots it writes")
    leaking = free_inputs_that_matter(lab)
    if leaking:
        experiment = f"poison the padded entries of {', '.join(leaking)} alone on the clean reference"
        evidence.append(f"{experiment}: real outputs change")
        return lab.diagnosis(PADDING_LEAK, leaking, evidence=evidence, experiment=experiment)
    evidence.append("no padded entry alone and no contract repair explains it")
    ruled_out = ["set the contract's padded entries inert in both references", "KV writes of padded tokens",
                 "poison each free padded input alone"]
    return lab.diagnosis(UNEXPLAINED, [], evidence=evidence, ruled_out=lab.ruled_out + ruled_out)


def _run_repaired(lab: Divergence, run: str, subset) -> tuple:
    """The forward's real outputs in `run` (as bytes, for an exact comparison) with `subset` set inert first."""
    engine, event = lab.side(run)
    owner = engine.owner(event.owner)

    def set_inert():
        for name, _, region, _ in subset:
            for tensor in {t.data_ptr(): t for t in (getattr(event.meta, name, None), owner.buffers[name])
                           if t is not None}.values():
                tensor[region] = owner.buffers.spec(name).inert_value(event.dispatch.num_tokens)
    out = lab.run(set_inert, side=run)
    return tuple((k, v.cpu().numpy().tobytes()) for k, v in sorted(out.items()))


def free_inputs_that_matter(lab: Divergence) -> list[str]:
    """FREE padded inputs that, poisoned one at a time on the clean reference, change its real outputs."""
    owner = lab.ref.owner(lab.ev_r.owner)
    names = [n for n in owner.buffers.names() if owner.buffers.spec(n).padding == FREE]
    matter = []
    d = lab.ev_r.dispatch
    for name in names:
        spec = owner.buffers.spec(name)     # `poison_padding` of this one buffer
        poisoned = lab.run(lambda: fill_like_live(owner.buffers[name], spec.used(d.num_tokens, d.num_reqs),
                                                  spec.padded(d), "A", 1), side="ref")
        if agree_any("padding: a free input matters", max_diff(lab.out_r, poisoned)[0] != 0):
            matter.append(name)
    lab.restore("ref")
    return matter


def slot_list(slots) -> str:
    """The first 8 slots, in order, and how many more."""
    slots = sorted(slots)
    shown = ", ".join(map(str, slots[:8]))
    return shown + (f" and {len(slots) - 8} more" if len(slots) > 8 else "")
